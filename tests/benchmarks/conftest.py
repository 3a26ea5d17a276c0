"""Fixtures for the benchmark tests."""

import pytest
import torch


@pytest.fixture
def keep_torch_threads():
    """For a benchmark's main() run in this process: it sets torch's thread count for its own work."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
