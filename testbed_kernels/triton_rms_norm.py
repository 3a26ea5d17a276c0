"""Fused RMSNorm with optional residual add; same results and return convention as `reference.rms_norm_ref`."""

import torch
import triton
import triton.language as tl

from testbed_kernels.triton_common import check_device


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # round the sum to the input dtype first, as the reference does
        summed = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    # reference rounds x*rstd to x's dtype before the weight multiply
    if HAS_RESIDUAL:
        normed = (x * rstd).to(res_out_ptr.dtype.element_ty).to(tl.float32) * w
    else:
        normed = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * stride_o + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """x: [..., hidden]. Returns normed, or (normed, x + residual) when residual is given (inputs untouched)."""
    hidden = x.shape[-1]
    check_device(x, weight)
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    sum_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    out = torch.empty(x.shape, dtype=torch.promote_types(sum_dtype, weight.dtype), device=x.device)
    out2 = out.view(-1, hidden)
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty(x.shape, dtype=sum_dtype, device=x.device)
        ro2 = res_out.view(-1, hidden)
    else:
        r2 = ro2 = x2  # unused placeholders
    block = triton.next_power_of_2(hidden)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight.contiguous(),
            out2,
            ro2,
            eps,
            x2.stride(0),
            r2.stride(0),
            out2.stride(0),
            ro2.stride(0),
            N=hidden,
            BLOCK=block,
            HAS_RESIDUAL=residual is not None,
            num_warps=min(max(block // 256, 1), 16),
        )
    return out if residual is None else (out, res_out)
