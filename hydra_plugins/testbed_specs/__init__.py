"""Puts the library's built-in spec sheets (testbed/specs: the device, link and model groups) on Hydra's
search path for every app, so `--help` lists their options and compose finds them (the config's own
`hydra.searchpath` only reaches composition, not the help's group listing)."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class TestbedSpecsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="testbed-specs", path="pkg://testbed.specs")
