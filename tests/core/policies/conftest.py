"""Fixtures for the policy tests."""

import pytest

from .helpers import Sim


@pytest.fixture
def sim():
    return Sim
