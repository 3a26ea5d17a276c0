"""The experiment runner's Hydra config tree, shipped as package data: every entry point composes it as
the config module `experiments.conf` (CONFIG_MODULE), never by file name, so a non-editable install runs
from any directory."""

CONFIG_MODULE = "experiments.conf"
CONFIG_PATH = "pkg://" + CONFIG_MODULE  # for @hydra.main(config_path=...)
