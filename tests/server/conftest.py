"""Shared helpers for the live-server tests (servers run in-process on a free loopback port)."""

import time

import httpx
import pytest
import torch

from testbed.server.metrics import parse_metrics


@pytest.fixture(scope="module")
def one_torch_thread():
    """The stepping thread and the event loop share 2 busy cores: one intra-op thread avoids OpenMP
    spin contention (x10 slower steps otherwise)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _scrape(url: str) -> dict[str, float]:
    return parse_metrics(httpx.get(url + "/metrics", timeout=10).text)


def _wait_for(predicate, timeout: float = 30.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def scrape():
    """scrape(url) -> {'metric{labels}': value, 'metric': value summed over labels}"""
    return _scrape


@pytest.fixture
def wait_for():
    """wait_for(predicate, timeout) -> the predicate's last value (truthy unless it timed out)"""
    return _wait_for
