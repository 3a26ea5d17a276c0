"""Scatter this step's keys/values into their paged cache slots; matches `reference.write_kv_ref`."""

import torch
import triton
import triton.language as tl

from testbed_kernels.triton_common import check_device


@triton.jit
def _kv_write_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    page = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    # slot -1 (padding token) writes nothing; the slot test is a tensor because the
    # interpreter turns scalar-bool & tensor-bool into an int mask
    slot_ok = (tl.zeros([BLOCK_H], tl.int64) + slot) >= 0
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM) & slot_ok[:, None]
    k = tl.load(key_ptr + tok * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(value_ptr + tok * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(
        k_cache_ptr + page * stride_kcb + off * stride_kct + h[:, None] * stride_kch + d[None, :],
        k.to(k_cache_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(
        v_cache_ptr + page * stride_vcb + off * stride_vct + h[:, None] * stride_vch + d[None, :],
        v.to(v_cache_ptr.dtype.element_ty),
        mask=mask,
    )


def write_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """key/value: [num_tokens, num_kv_heads, head_dim] (any token/head strides) -> cache slots, in place."""
    num_tokens, num_kv_heads, head_dim = key.shape
    block_size = k_cache.shape[1]
    assert key.stride(-1) == 1 and value.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    check_device(key, value, k_cache, v_cache)
    if num_tokens == 0:
        return
    _kv_write_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )
