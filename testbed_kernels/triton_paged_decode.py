"""Paged decode attention (one query token per sequence), GQA-aware, with optional split-KV.

Matches `reference.paged_attention_ref` for query_start_loc = arange(num_seqs + 1).
One program handles every query head of one KV head, so each K/V tile is loaded once per group.
The KV tile (BLOCK_N tokens) is independent of the cache block size: each token's page is looked
up in the block table, so any power-of-two block size works and tl.dot always sees >= 16 rows.
Split-KV (flash-decoding): long contexts are cut into NUM_SPLITS chunks computed in parallel, each
writing an unnormalised partial output plus its running max / sum; a reduce kernel merges them.
Each sequence's chunk length is computed in the kernel from its own length, so no host-side bound on
the lengths is baked into a launch: with a fixed split count the launch is CUDA-graph safe (the
partials are allocated per call, which inside a capture comes from the graph's private pool).
"""

import functools

import torch
import triton
import triton.language as tl

from testbed_kernels.triton_common import check_device, dot_upcast, mma

LOG2E = 1.4426950408889634
MIN_SPLIT_TOKENS = 256  # below this a split is not worth its reduce traffic
MAX_SPLITS = 32


@triton.jit
def _decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    part_ptr,
    m_ptr,
    l_ptr,
    seq_lens_ptr,
    bt_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    if NUM_SPLITS == 1:
        lo = 0
        hi = seq_len
    else:
        # this sequence's chunk: ceil(seq_len / NUM_SPLITS) rounded up to whole KV tiles
        split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = split * split_len
        hi = tl.minimum(lo + split_len, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        page = tl.load(bt_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        off = pos % BLOCK_SIZE
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(
            k_ptr + page[:, None] * stride_kb + off[:, None] * stride_kt + kvh * stride_kh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = mma(q, tl.trans(k), UPCAST) * qk_scale  # log2 domain
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_ptr + page[:, None] * stride_vb + off[:, None] * stride_vt + kvh * stride_vh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        acc = acc * alpha[:, None] + mma(p, v, UPCAST)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # empty sequence -> zeros, not NaN
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )
    else:
        # partials laid out [num_seqs, num_heads, NUM_SPLITS, (HEAD_DIM)]
        row = (seq * (tl.num_programs(1) * GROUP) + heads) * NUM_SPLITS + split
        tl.store(m_ptr + row, m_i, mask=g_mask)
        tl.store(l_ptr + row, l_i, mask=g_mask)
        tl.store(part_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def _reduce_kernel(
    out_ptr,
    part_ptr,
    m_ptr,
    l_ptr,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = sp < NUM_SPLITS
    d_mask = d < HEAD_DIM
    row = (seq * tl.num_programs(1) + head) * NUM_SPLITS + sp
    m = tl.load(m_ptr + row, mask=s_mask, other=float("-inf"))
    lse_sum = tl.load(l_ptr + row, mask=s_mask, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)  # empty splits weigh 0
    part = tl.load(part_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    num = tl.sum(part * w[:, None], 0)
    den = tl.sum(lse_sum * w, 0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


@functools.cache
def _target_programs(device: torch.device) -> int:
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 256


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Split only when (seq, kv head) programs alone cannot fill the device and contexts are long."""
    programs = num_seqs * num_kv_heads
    target = _target_programs(device)
    if programs >= target or max_seq_len < 2 * MIN_SPLIT_TOKENS:
        return 1
    return max(1, min(MAX_SPLITS, max_seq_len // MIN_SPLIT_TOKENS, triton.cdiv(target, programs)))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """q: [num_seqs, num_heads, head_dim] -> [num_seqs, num_heads, head_dim] in q's dtype.

    num_splits: None = automatic by context length, 1 = no split-KV, >1 forces that many splits.
    max_seq_len: host-side upper bound on seq_lens (avoids a device sync); only picks the automatic split
        count (chunks are sized per sequence in the kernel), so any bound, e.g. max_model_len, is correct.
    """
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and block_size & (block_size - 1) == 0
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    check_device(q, k_cache, v_cache)
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, q.device)
    block_n = block_n or (64 if head_dim <= 128 else 32)
    block_d = triton.next_power_of_2(head_dim)
    if num_splits > 1:
        part = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        m = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        lsum = torch.empty_like(m)
    else:
        part = m = lsum = out  # unused placeholders
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        out,
        part,
        m,
        lsum,
        seq_lens,
        block_tables,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        UPCAST=dot_upcast(q.dtype),
        num_warps=4,
    )
    if num_splits > 1:
        _reduce_kernel[(num_seqs, num_heads)](
            out,
            part,
            m,
            lsum,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
