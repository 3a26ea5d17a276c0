"""GPU-only sanity timing: the Triton decode kernel must beat the gather-everything torch decode."""

import pytest
import torch

from benchmarks.roofline import cuda_time_ms

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_decode_faster_than_torch_reference():
    from testbed.attention.backend import AttentionMetadata, KernelBackend
    from testbed_kernels.triton_paged_decode import paged_decode

    seqs, kv_heads, heads, head_dim, block_size, ctx = 32, 8, 32, 128, 16, 2048
    blocks_per_seq = ctx // block_size
    dev, dt = "cuda", torch.bfloat16
    k_cache = torch.randn(seqs * blocks_per_seq, block_size, kv_heads, head_dim, device=dev, dtype=dt)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(seqs * blocks_per_seq, device=dev).view(seqs, -1).to(torch.int32)
    seq_lens = torch.full((seqs,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(seqs, heads, head_dim, device=dev, dtype=dt)
    meta = AttentionMetadata(
        torch.zeros(seqs, dtype=torch.int64, device=dev),
        torch.arange(seqs + 1, dtype=torch.int32, device=dev),
        seq_lens,
        tables,
        1,
        ctx,
    )
    scale = head_dim**-0.5
    ref = KernelBackend()._decode(q, k_cache, v_cache, meta, scale)
    out = paged_decode(q, k_cache, v_cache, seq_lens, tables, scale, max_seq_len=ctx)
    assert (out.float() - ref.float()).abs().max() < 2e-2
    t_triton = cuda_time_ms(
        lambda: paged_decode(q, k_cache, v_cache, seq_lens, tables, scale, max_seq_len=ctx), iters=20
    )
    t_torch = cuda_time_ms(lambda: KernelBackend()._decode(q, k_cache, v_cache, meta, scale), iters=20)
    print(f"decode: triton {t_triton:.3f} ms, torch reference {t_torch:.3f} ms")
    assert t_triton < t_torch
