"""The experiment runner's Hydra config tree, shipped as package data: every entry point composes it as
the config module `experiments.conf` (CONFIG_MODULE), never by file name, so a non-editable install runs
from any directory. Importing it registers the groups' typed schemas (schema.py) in Hydra's ConfigStore,
which the options' yaml files name in their defaults."""

from experiments.conf.schema import register

CONFIG_MODULE = "experiments.conf"
CONFIG_PATH = "pkg://" + CONFIG_MODULE  # for @hydra.main(config_path=...)

register()
