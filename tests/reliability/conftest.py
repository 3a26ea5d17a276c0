"""Fixtures shared with other test folders."""

from ..server.conftest import scrape, wait_for  # noqa: F401  (pytest fixtures, used by name)
from ..traces.conftest import tok, write  # noqa: F401  (pytest fixtures, used by name)
