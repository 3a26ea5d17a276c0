"""Small helpers shared by the Triton kernels (no kernels of their own)."""

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when kernels run on the CPU interpreter (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)


def check_device(*tensors: torch.Tensor) -> None:
    """Fail clearly instead of deep inside triton when CPU tensors meet a compiled launch."""
    if not interpreting() and any(not t.is_cuda for t in tensors):
        raise RuntimeError("Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter)")


def dot_upcast(dtype: torch.dtype) -> bool:
    """Whether tl.dot operands must be upcast to fp32 (exact ieee) instead of native fp16/bf16.

    fp32 inputs: avoid tf32 so results match the reference to ~1e-6.
    Interpreter: it stores bf16 as raw uint16 bits, so bf16 arithmetic there is garbage.
    """
    return dtype == torch.float32 or interpreting()


@triton.jit
def mma(a, b, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation; b's dtype is the native operand dtype when not upcasting."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(b.dtype), b)
