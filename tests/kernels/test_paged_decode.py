"""Triton paged decode attention (plain and split-KV) vs reference.paged_attention_ref."""

import pytest
import torch

from testbed_kernels.reference import paged_attention_ref
from testbed_kernels.triton_paged_decode import choose_num_splits, paged_decode


def run_decode(paged_kv, ctx_lens, block_size, num_kv_heads, group, head_dim, dtype, num_splits, seed=0):
    k_cache, v_cache, tables, seq_lens = paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(ctx_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype).to(k_cache.device)
    scale = head_dim**-0.5
    qsl = torch.arange(len(ctx_lens) + 1, dtype=torch.int32, device=q.device)
    ref = paged_attention_ref(q.cpu(), k_cache.cpu(), v_cache.cpu(), qsl.cpu(), seq_lens.cpu(), tables.cpu(), scale)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    res = paged_decode(q, k_cache, v_cache, seq_lens, tables, scale, num_splits=num_splits, out=out)
    assert res is out
    return out.cpu(), ref


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size", [8, 16, 64])
def test_decode_fp32(paged_kv, assert_close, block_size, group, head_dim, num_splits):
    # lengths straddle block boundaries; 1 token and short contexts leave some splits empty
    ctx_lens = [1, block_size + 3, 3 * block_size - 1, 77]
    out, ref = run_decode(paged_kv, ctx_lens, block_size, 2, group, head_dim, torch.float32, num_splits)
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("block_size,group,head_dim", [(16, 4, 128), (64, 3, 64)])
def test_decode_half(paged_kv, assert_close, dtype, num_splits, block_size, group, head_dim):
    out, ref = run_decode(paged_kv, [5, 100, 130], block_size, 2, group, head_dim, dtype, num_splits)
    assert_close(out, ref)


def test_choose_num_splits():
    cpu = torch.device("cpu")
    assert choose_num_splits(1, 8, 100, cpu) == 1  # short context: no split
    assert choose_num_splits(512, 8, 8192, cpu) == 1  # enough programs already
    assert choose_num_splits(1, 1, 1100, cpu) == 4  # long context, one program: split
    assert choose_num_splits(1, 1, 10**6, cpu) == 32  # capped


def test_decode_auto_split_long_context(paged_kv, assert_close):
    # one sequence, one KV head, long context: the automatic choice splits
    out, ref = run_decode(paged_kv, [1100], 64, 1, 4, 64, torch.float32, None)
    assert_close(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 5])
@pytest.mark.parametrize("block_size", [8, 32, 128, 256])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_decode_half_sweep(paged_kv, assert_close, dtype, num_splits, block_size, group):
    out, ref = run_decode(paged_kv, [1, 300, block_size + 1], block_size, 2, group, 128, dtype, num_splits)
    assert_close(out, ref)
