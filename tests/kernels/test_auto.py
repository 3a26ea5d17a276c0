"""kernel=auto: the fastest backend that works on the device at hand, named in the engine and summaries."""

import shutil

import pytest
import torch

from testbed.attention import resolve_kernel


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("TESTBED_KERNEL", raising=False)  # the suite's own setting (tests/conftest.py)


def test_the_environment_names_what_auto_means(monkeypatch):
    monkeypatch.setenv("TESTBED_KERNEL", "triton")
    assert resolve_kernel("auto", torch.device("cpu")) == "triton"


def test_explicit_kernels_are_kept():
    for name in ("torch", "triton", "cpu"):
        assert resolve_kernel(name, "cpu") == name


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="needs a C++ compiler")
def test_auto_on_a_cpu_with_a_compiler_is_the_cpp_kernels():
    assert resolve_kernel("auto", torch.device("cpu")) == "cpu"


def test_auto_falls_back_to_torch_when_the_cpp_kernels_do_not_build(monkeypatch, caplog):
    import testbed_kernels.cpu

    def broken():
        raise RuntimeError("kernel=cpu needs a C++ compiler")

    monkeypatch.setattr(testbed_kernels.cpu, "load", broken)
    assert resolve_kernel("auto", torch.device("cpu")) == "torch"
    assert "unavailable" in caplog.text


def test_auto_on_cuda_is_triton(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real(name, *a))
    assert resolve_kernel("auto", torch.device("cuda")) == "triton"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert resolve_kernel("auto", torch.device("cuda")) == "torch"
