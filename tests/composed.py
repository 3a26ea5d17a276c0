"""The experiment config composed from overrides once per test session: tests/config/test_every_leaf.py and
tests/runner/test_seeds.py both compose every option of every group (a Hydra compose costs ~0.15 s).
Every caller gets its own copy, so no test sees another's changes."""

import copy

from hydra import compose
from omegaconf import DictConfig

_COMPOSED: dict[tuple[str, ...], DictConfig] = {}


def composed(*overrides: str) -> DictConfig:
    """compose("config", overrides), inside an initialize_config_module("experiments.conf") context; a refused
    composition raises as compose does (and is tried again next time)."""
    if overrides not in _COMPOSED:
        _COMPOSED[overrides] = compose("config", overrides=list(overrides))
    return copy.deepcopy(_COMPOSED[overrides])
