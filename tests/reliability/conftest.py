"""Fixtures shared with other test folders."""

from ..traces.conftest import tok, write  # noqa: F401  (pytest fixtures, used by name)
