"""Variable-length causal prefill attention over the paged KV cache, many sequences in one launch.

Matches `reference.paged_attention_ref`: sequence i's queries are the last q_len tokens of its
seq_lens[i]-token context, whose K/V (cached prefix + this chunk) are already in the cache.
Program (seq, query tile, kv head): the BLOCK_M rows are BLOCK_Q tokens x GROUP query heads of one
KV head, so each K/V tile is loaded once for the whole group. Online softmax in fp32 (exp2).
"""

import torch
import triton
import triton.language as tl

from testbed_kernels.triton_common import check_device, dot_upcast, mma

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    qsl_ptr,
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
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    q_tile = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:  # grid is sized for the longest query chunk
        return
    ctx_len = tl.load(seq_lens_ptr + seq)
    prefix = ctx_len - q_len

    r = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + r // GROUP
    heads = kvh * GROUP + r % GROUP
    row_mask = (r < BLOCK_Q * GROUP) & (tok < q_len)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    io_mask = row_mask[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + (q_start + tok)[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=io_mask,
        other=0.0,
    )
    q_pos = prefix + tok

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # keys past the tile's last query position are causally masked for every row
    hi = tl.minimum(ctx_len, prefix + tl.minimum((q_tile + 1) * BLOCK_Q, q_len))
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    for start in range(0, hi, BLOCK_N):
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
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: key 0 is visible to every row
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

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + (q_start + tok)[:, None].to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """q: [num_tokens, num_heads, head_dim] -> same shape/dtype. Tokens with no sequence are left untouched.

    max_query_len: host-side bound on query lengths (avoids a device sync when given).
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and block_size & (block_size - 1) == 0
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    check_device(q, k_cache, v_cache)
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or num_tokens == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    block_m = max(block_m or 64, triton.next_power_of_2(group))
    block_q = block_m // group
    block_n = block_n or (64 if head_dim <= 128 else 32)
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        query_start_loc,
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
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_N=block_n,
        UPCAST=dot_upcast(q.dtype),
        num_warps=4 if block_m * triton.next_power_of_2(head_dim) <= 64 * 64 else 8,
    )
    return out
