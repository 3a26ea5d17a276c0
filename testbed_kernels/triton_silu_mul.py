"""SiLU(gate) * up for x = [..., 2*d] (gate | up); matches `reference.silu_and_mul_ref` (fp32 math)."""

import torch
import triton
import triton.language as tl

from testbed_kernels.triton_common import check_device


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + D + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    d = x.shape[-1] // 2
    check_device(x)
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if out is None:
        out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, d)
    block = min(triton.next_power_of_2(d), 1024)
    if x2.shape[0] > 0:
        _silu_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, out2, x2.stride(0), out2.stride(0), D=d, BLOCK=block, num_warps=4
        )
    return out
