"""experiments.run.frozen_gc: what is alive is frozen and young collections are rarer inside the block; the
process's own settings come back after it, also when the block raises."""

import gc

import pytest

from experiments.run.frozen_gc import YOUNG_THRESHOLD, frozen_gc


def test_freezes_and_restores():
    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with pytest.raises(KeyError), frozen_gc():
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > frozen
        raise KeyError("inside")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
