"""Fixtures for the runner tests (no __init__.py: pytest imports this per directory)."""

import pytest


@pytest.fixture
def tiny_cfg():
    """A composed config for in-process runs: model=tiny, small synthetic trace, quiet."""
    from hydra import compose, initialize_config_module

    def make(*overrides):
        with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
            return compose("config", overrides=["model=tiny", "progress=false", "cache.num_blocks=2048", *overrides])

    return make
