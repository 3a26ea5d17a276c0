"""Triton varlen causal prefill over paged KV (cached prefix + new chunk) vs reference.paged_attention_ref."""

import pytest
import torch

from testbed_kernels.reference import paged_attention_ref
from testbed_kernels.triton_paged_prefill import paged_prefill


def run_prefill(paged_kv, q_lens, ctx_lens, block_size, num_kv_heads, group, head_dim, dtype, seed=0, **kw):
    k_cache, v_cache, tables, seq_lens = paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype).to(k_cache.device)
    qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32).to(q.device)
    scale = head_dim**-0.5
    ref = paged_attention_ref(q.cpu(), k_cache.cpu(), v_cache.cpu(), qsl.cpu(), seq_lens.cpu(), tables.cpu(), scale)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    res = paged_prefill(q, k_cache, v_cache, qsl, seq_lens, tables, scale, out=out, **kw)
    assert res is out
    return out.cpu(), ref


def batch(block_size):
    """(query lens, context lens): fresh prompt, chunk after a cached prefix, a decode-like
    single token, an idle sequence, and a chunk longer than one query tile."""
    q_lens = [7, 5, 1, 0, 33]
    ctx_lens = [7, 5 + 2 * block_size + 3, 20, 9, 40]
    return q_lens, ctx_lens


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size", [8, 16, 64])
def test_prefill_fp32(paged_kv, assert_close, block_size, group, head_dim):
    q_lens, ctx_lens = batch(block_size)
    out, ref = run_prefill(paged_kv, q_lens, ctx_lens, block_size, 2, group, head_dim, torch.float32)
    assert_close(out, ref)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64)])
def test_prefill_small_tiles(paged_kv, assert_close, block_m, block_n):
    # several query and key tiles per sequence, tiles crossing the prefix/chunk boundary
    out, ref = run_prefill(paged_kv, [30, 17], [70, 17], 16, 1, 4, 64, torch.float32, block_m=block_m, block_n=block_n)
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size,group,head_dim", [(16, 4, 128), (64, 3, 64)])
def test_prefill_half(paged_kv, assert_close, dtype, block_size, group, head_dim):
    q_lens, ctx_lens = batch(block_size)
    out, ref = run_prefill(paged_kv, q_lens, ctx_lens, block_size, 2, group, head_dim, dtype)
    assert_close(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [32, 128, 256])
@pytest.mark.parametrize("group", [1, 8])
def test_prefill_sweep(paged_kv, assert_close, dtype, block_size, group):
    out, ref = run_prefill(paged_kv, [100, 3, 64], [100, 300, 64 + block_size], block_size, 2, group, 128, dtype)
    assert_close(out, ref)
