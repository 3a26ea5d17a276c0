"""Fixtures for the runner tests (no __init__.py: pytest imports this per directory)."""

import pytest

from .helpers import ROOT


@pytest.fixture
def tiny_cfg():
    """A composed config for in-process runs: model=tiny, small synthetic trace, quiet."""
    from hydra import compose, initialize_config_dir

    def make(*overrides):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return compose("config", overrides=["model=tiny", "progress=false", "cache.num_blocks=2048", *overrides])

    return make
