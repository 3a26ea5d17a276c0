"""Neox-style rotary embedding; matches `reference.rotary_ref`, in place or into new tensors.

cos_sin_cache: [max_pos, rot_dim] with cos in the first half and sin in the second; rot_dim = head_dim.
One program per token rotates all of its query and key heads (one launch for both).
"""

import torch
import triton
import triton.language as tl

from testbed_kernels.triton_common import check_device


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    tok,
    stride_t,
    stride_h,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_HALF)
    mask = (h[:, None] < NUM_HEADS) & (c[None, :] < HALF)
    base = tok * stride_t + h[:, None] * stride_h + c[None, :]
    x1 = tl.load(src_ptr + base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + base + HALF, mask=mask, other=0.0).to(tl.float32)
    ty = dst_ptr.dtype.element_ty
    tl.store(dst_ptr + base, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(dst_ptr + base + HALF, (x2 * cos + x1 * sin).to(ty), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cache_ptr,
    stride_cache,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    c = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + c, mask=c < HALF, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + c, mask=c < HALF, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, q_out_ptr, tok, stride_qt, stride_qh, cos, sin, NUM_Q_HEADS, HALF, BLOCK_QH, BLOCK_HALF)
    _rotate_heads(k_ptr, k_out_ptr, tok, stride_kt, stride_kh, cos, sin, NUM_K_HEADS, HALF, BLOCK_KH, BLOCK_HALF)


def rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, inplace: bool = False
):
    """q: [num_tokens, num_heads, head_dim], k: [num_tokens, num_kv_heads, head_dim]. Returns (q, k) rotated.

    inplace=True overwrites q and k (their token/head strides may be arbitrary, e.g. views of a fused qkv).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    assert cos_sin_cache.shape[-1] == head_dim and head_dim % 2 == 0
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    check_device(q, k, cos_sin_cache)
    if inplace:
        q_out, k_out = q, k
    else:
        q, k = q.contiguous(), k.contiguous()  # outputs share the input strides
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    half = head_dim // 2
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            positions,
            q,
            k,
            q_out,
            k_out,
            cos_sin_cache,
            cos_sin_cache.stride(0),
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            NUM_Q_HEADS=num_q_heads,
            NUM_K_HEADS=num_k_heads,
            HALF=half,
            BLOCK_QH=triton.next_power_of_2(num_q_heads),
            BLOCK_KH=triton.next_power_of_2(num_k_heads),
            BLOCK_HALF=triton.next_power_of_2(half),
            num_warps=4,
        )
    return q_out, k_out
