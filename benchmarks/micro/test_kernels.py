"""Microbenchmarks: each Triton kernel and C++ CPU kernel (kernel=cpu) vs its torch reference (pytest-benchmark).

Run on purpose: `python -m pytest benchmarks/test_bench_kernels.py` (not under testpaths).
Triton cases need CUDA (the CPU interpreter is far too slow to time), C++ CPU cases a CPU run; torch
references always run, at realistic shapes on CUDA and scaled-down shapes on CPU.
"""

import pytest
import torch

from testbed_kernels import reference

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32
IMPLS = [
    "torch",
    pytest.param("triton", marks=pytest.mark.skipif(not CUDA, reason="Triton timing needs CUDA")),
    pytest.param("cpu", marks=pytest.mark.skipif(CUDA, reason="the C++ CPU kernels are timed on CPU runs")),
]
# (decode seqs, decode ctx, prefill seqs, prefill len, tokens, hidden, intermediate)
SHAPE = (64, 2048, 4, 1024, 4096, 4096, 11008) if CUDA else (4, 256, 2, 128, 256, 1024, 2816)
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16


def timed(benchmark, fn):
    def run():
        fn()
        if CUDA:
            torch.cuda.synchronize()

    run()  # warm up / compile outside the timing
    benchmark(run)


def paged(num_seqs, ctx):
    per_seq = -(-ctx // BLOCK)
    k_cache = torch.randn(num_seqs * per_seq, BLOCK, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    tables = torch.randperm(num_seqs * per_seq, device=DEV).view(num_seqs, per_seq).to(torch.int32)
    seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32, device=DEV)
    return k_cache, torch.randn_like(k_cache), tables, seq_lens


@pytest.mark.parametrize("impl", IMPLS)
def test_decode(benchmark, impl):
    from testbed.attention.backend import AttentionMetadata, KernelBackend

    seqs, ctx = SHAPE[0], SHAPE[1]
    k_cache, v_cache, tables, seq_lens = paged(seqs, ctx)
    q = torch.randn(seqs, HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    scale = HEAD_DIM**-0.5
    if impl == "triton":
        from testbed_kernels.triton_paged_decode import paged_decode

        fn = lambda: paged_decode(q, k_cache, v_cache, seq_lens, tables, scale, max_seq_len=ctx)
    elif impl == "cpu":
        from testbed_kernels.cpu import paged_decode

        fn = lambda: paged_decode(q, k_cache, v_cache, seq_lens, tables, scale)
    else:
        meta = AttentionMetadata(
            torch.zeros(seqs, dtype=torch.int64, device=DEV),
            torch.arange(seqs + 1, dtype=torch.int32, device=DEV),
            seq_lens,
            tables,
            1,
            ctx,
        )
        fn = lambda: KernelBackend()._decode(q, k_cache, v_cache, meta, scale)
    timed(benchmark, fn)


@pytest.mark.parametrize("impl", IMPLS)
def test_prefill(benchmark, impl):
    seqs, length = SHAPE[2], SHAPE[3]
    k_cache, v_cache, tables, seq_lens = paged(seqs, length)
    q = torch.randn(seqs * length, HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    qsl = torch.arange(0, seqs * length + 1, length, dtype=torch.int32, device=DEV)
    args = (q, k_cache, v_cache, qsl, seq_lens, tables, HEAD_DIM**-0.5)
    if impl == "triton":
        from testbed_kernels.triton_paged_prefill import paged_prefill

        timed(benchmark, lambda: paged_prefill(*args, max_query_len=length))
    elif impl == "cpu":
        from testbed.attention.backend import AttentionMetadata
        from testbed.attention.cpu_backend import CpuBackend

        meta = AttentionMetadata(None, qsl, seq_lens, tables, length, length)
        backend = CpuBackend()
        timed(benchmark, lambda: backend.attend_cached(q, k_cache, v_cache, meta, HEAD_DIM**-0.5))
    else:
        timed(benchmark, lambda: reference.paged_attention_ref(*args))


@pytest.mark.parametrize("impl", IMPLS)
def test_write_kv(benchmark, impl):
    tokens = SHAPE[4]
    k_cache, v_cache, _, _ = paged(1, 2 * tokens)
    key, value = (torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE) for _ in range(2))
    slots = torch.randperm(2 * tokens, device=DEV)[:tokens]
    if impl == "triton":
        from testbed_kernels.triton_kv_write import write_kv as fn
    elif impl == "cpu":
        pytest.skip("kernel=cpu writes the cache with the reference's index_copy_")
    else:
        fn = reference.write_kv_ref
    timed(benchmark, lambda: fn(key, value, k_cache, v_cache, slots))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_rms_norm(benchmark, impl, residual):
    tokens, hidden = SHAPE[4], SHAPE[5]
    x, r = (torch.randn(tokens, hidden, device=DEV, dtype=DTYPE) for _ in range(2))
    w = torch.randn(hidden, device=DEV, dtype=DTYPE)
    if impl == "triton":
        from testbed_kernels.triton_rms_norm import rms_norm as fn
    elif impl == "cpu":
        from testbed_kernels.cpu import rms_norm as fn
    else:
        fn = reference.rms_norm_ref
    timed(benchmark, lambda: fn(x, w, 1e-6, r if residual else None))


@pytest.mark.parametrize("impl", IMPLS)
def test_silu_and_mul(benchmark, impl):
    x = torch.randn(SHAPE[4], 2 * SHAPE[6], device=DEV, dtype=DTYPE)
    if impl == "triton":
        from testbed_kernels.triton_silu_mul import silu_and_mul as fn
    elif impl == "cpu":
        pytest.skip("kernel=cpu uses the reference SiLU-mul")
    else:
        fn = reference.silu_and_mul_ref
    timed(benchmark, lambda: fn(x))


@pytest.mark.parametrize("impl", IMPLS)
def test_rotary(benchmark, impl):
    tokens = SHAPE[4]
    q = torch.randn(tokens, HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device=DEV, dtype=DTYPE)
    cache = torch.randn(8192, HEAD_DIM, device=DEV)
    positions = torch.randint(0, 8192, (tokens,), device=DEV)
    if impl == "triton":
        from testbed_kernels.triton_rotary import rotary

        fn = lambda: rotary(positions, q, k, cache, inplace=True)
    elif impl == "cpu":
        from testbed_kernels.cpu import rotary

        fn = lambda: rotary(positions, q, k, cache)
    else:
        fn = lambda: reference.rotary_ref(positions, q, k, cache)
    timed(benchmark, fn)
