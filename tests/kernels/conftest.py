"""Kernel tests: on machines without CUDA the Triton kernels run on the CPU interpreter."""

import os
import shutil

import torch

if not torch.cuda.is_available():
    # must be set before any triton.jit decoration, i.e. before testbed_kernels/triton_* are imported
    os.environ["TRITON_INTERPRET"] = "1"

import pytest

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# max |out - ref| / max |ref|; the interpreter truncates fp32 -> bf16 (GPU rounds), hence bf16's margin
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "gpu: needs CUDA (timing); skipped without it")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def assert_close():
    """Relative-to-max error check that also fails on any NaN left in a poisoned output."""

    def check(out, ref, dtype=None):
        dtype = dtype or ref.dtype
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert not torch.isnan(out).any(), "output has unwritten (NaN) elements"
        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()
        assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e}"

    return check


@pytest.fixture
def paged_kv():
    """Random paged K/V cache holding `ctx_lens` tokens per sequence behind shuffled block tables."""

    def make(ctx_lens, block_size, num_kv_heads, head_dim, dtype, seed=0):
        gen = torch.Generator().manual_seed(seed)
        max_blocks = max(-(-n // block_size) for n in ctx_lens) + 1  # +1: unused trailing table entry
        num_blocks = len(ctx_lens) * max_blocks + 2
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_cache = torch.randn(shape, generator=gen).to(dtype)
        v_cache = torch.randn(shape, generator=gen).to(dtype)
        tables = torch.randperm(num_blocks, generator=gen)[: len(ctx_lens) * max_blocks]
        tables = tables.view(len(ctx_lens), max_blocks).to(torch.int32)
        seq_lens = torch.tensor(ctx_lens, dtype=torch.int32)
        return [t.to(DEVICE) for t in (k_cache, v_cache, tables, seq_lens)]

    return make


@pytest.fixture(scope="session")
def cpu_kernels():
    """testbed_kernels.cpu, built (or loaded from its cache); tests that take it skip where no C++ compiler is."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("kernel=cpu builds its kernels with a C++ compiler")
    import testbed_kernels.cpu

    testbed_kernels.cpu.load()
    return testbed_kernels.cpu
