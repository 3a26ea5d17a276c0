"""kernel=cpu: the C++ flash-attention prefill (testbed_kernels/cpu/paged_prefill.cpp) vs reference.paged_attention_ref,
on fresh random inputs."""

import pytest
import torch

from testbed_kernels.reference import paged_attention_ref


def run(
    cpu_kernels, paged_kv, q_lens, ctx_lens, block_size, num_kv_heads, group, head_dim, dtype, cache_dtype=None, seed=0
):
    """Every sequence with q_len > 1 as one chunk; sequences with q_len <= 1 are left out of the call, so their
    rows of out must keep the poison they started with."""
    k_cache, v_cache, tables, seq_lens = [
        t.cpu() for t in paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, cache_dtype or dtype, seed)
    ]
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    starts = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    chunks = torch.tensor(
        [(i, starts[i], n, c) for i, (n, c) in enumerate(zip(q_lens, ctx_lens)) if n > 1], dtype=torch.int64
    ).view(-1, 4)
    ref = paged_attention_ref(q, k_cache, v_cache, torch.tensor(starts), seq_lens, tables, head_dim**-0.5)
    out = torch.full_like(q, float("nan"))
    assert cpu_kernels.paged_prefill(q, k_cache, v_cache, tables, chunks, head_dim**-0.5, out=out) is out
    in_chunk = torch.zeros(q.shape[0], dtype=torch.bool)
    for _, lo, n, _ in chunks.tolist():
        in_chunk[lo : lo + n] = True
    assert torch.isnan(out[~in_chunk]).all(), "rows outside every chunk must be left alone"
    return out[in_chunk], ref[in_chunk]


# a fresh prompt over two query tiles (128 positions each) and several key chunks; a chunk after a cached
# prefix that starts mid key-chunk; a decode token (left out); a 2-token chunk; an idle sequence (left out)
BATCH = ([200, 37, 1, 2, 0], [200, 37 + 70, 90, 2, 9])


@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size,head_dim", [(16, 64), (8, 128), (5, 64), (16, 80), (256, 32)])
def test_paged_prefill_matches_reference(cpu_kernels, paged_kv, assert_close, group, block_size, head_dim):
    out, ref = run(cpu_kernels, paged_kv, *BATCH, block_size, 2, group, head_dim, torch.float32, seed=group + head_dim)
    assert_close(out, ref)


@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [(torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.bfloat16, None), (torch.float16, None)],
)
def test_paged_prefill_narrow_types(cpu_kernels, paged_kv, assert_close, dtype, cache_dtype):
    """kv_cache_dtype (fp32 queries over a narrower cache) and half-precision models: fp32 accumulation."""
    out, ref = run(cpu_kernels, paged_kv, *BATCH, 16, 2, 3, 64, dtype, cache_dtype)
    assert out.dtype == dtype
    assert_close(out, ref)


def test_paged_prefill_long_prompt_and_many_chunks(cpu_kernels, paged_kv, assert_close):
    """More work items than threads, dealt by cost: a 700-token prompt beside short ones and a prefix chunk."""
    out, ref = run(
        cpu_kernels, paged_kv, [700, 3, 64, 129], [700, 3, 64 + 300, 129], 16, 3, 3, 64, torch.float32, seed=7
    )
    assert_close(out, ref)


def test_paged_prefill_strided_query(cpu_kernels, paged_kv, assert_close):
    """q sliced out of a fused qkv projection (row stride > heads * head_dim) is read correctly."""
    k_cache, v_cache, tables, seq_lens = [t.cpu() for t in paged_kv([40, 25], 16, 3, 64, torch.float32)]
    qkv = torch.randn(40 + 10, (9 + 6) * 64)
    q = qkv[:, : 9 * 64].view(50, 9, 64)
    chunks = torch.tensor([[0, 0, 40, 40], [1, 40, 10, 25]])
    ref = paged_attention_ref(q.contiguous(), k_cache, v_cache, torch.tensor([0, 40, 50]), seq_lens, tables, 0.125)
    assert_close(cpu_kernels.paged_prefill(q, k_cache, v_cache, tables, chunks, 0.125), ref)


def test_paged_prefill_rejects_bad_input(cpu_kernels, paged_kv):
    k_cache, v_cache, tables, _ = [t.cpu() for t in paged_kv([20], 16, 2, 64, torch.float32)]
    q = torch.randn(20, 4, 64)
    with pytest.raises(RuntimeError, match="chunk 0 names sequence 1"):
        cpu_kernels.paged_prefill(q, k_cache, v_cache, tables, torch.tensor([[1, 0, 20, 20]]), 0.125)
    with pytest.raises(RuntimeError, match="does not fit"):  # more rows than q has
        cpu_kernels.paged_prefill(q, k_cache, v_cache, tables, torch.tensor([[0, 5, 20, 20]]), 0.125)
    with pytest.raises(RuntimeError, match="does not fit"):  # a context longer than the block table holds
        cpu_kernels.paged_prefill(q, k_cache, v_cache, tables, torch.tensor([[0, 0, 20, 10_000]]), 0.125)
    with pytest.raises(RuntimeError, match=r"\[chunks, 4\]"):
        cpu_kernels.paged_prefill(q, k_cache, v_cache, tables, torch.tensor([0, 0, 20, 20]), 0.125)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        cpu_kernels.paged_prefill(q.double(), k_cache, v_cache, tables, torch.tensor([[0, 0, 20, 20]]), 0.125)
