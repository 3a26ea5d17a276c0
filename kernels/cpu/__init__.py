"""C++ CPU kernels (`kernel=cpu`), built on first use with torch's extension builder and cached.

The build needs a C++ compiler (g++) and ninja; the result is cached under TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions), so only the first process pays the compile (~20 s on 2 cores).
"""

import hashlib
import platform
import shutil
from functools import cache
from pathlib import Path

import torch

_SOURCES = [Path(__file__).with_name(name) for name in ("paged_decode.cpp", "layer_ops.cpp", "linear.cpp")]
# linear(): rows up to this many go to the few-rows kernel (linear.cpp), more to torch's GEMM
FEW_ROWS = 32


def _cpu_tag() -> str:
    """The build uses -march=native: a home directory shared by different CPUs (a Slurm cluster) must not
    hand one CPU's build to another, so the extension's name carries a hash of this CPU's feature flags."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.machine() + platform.processor()
    return hashlib.sha1(flags.encode()).hexdigest()[:10]


@cache
def load() -> None:
    """Compile (once) and load the extension; its ops then live under torch.ops.testbed_cpu."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError(
            "kernel=cpu needs a C++ compiler (g++) to build its kernels; install one or use kernel=torch"
        )
    from torch.utils.cpp_extension import load as build

    try:
        build(
            name=f"testbed_cpu_kernels_{_cpu_tag()}",
            sources=[str(s) for s in _SOURCES],
            extra_include_paths=[str(Path(__file__).parent)],
            is_python_module=False,
            extra_cflags=["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except (RuntimeError, OSError) as e:
        raise RuntimeError(f"kernel=cpu: building its C++ kernels failed (use kernel=torch meanwhile): {e}") from e


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence over its paged KV; same contract as reference.paged_attention_ref.
    The cache may be in a different float dtype than q (kv_cache_dtype)."""
    load()
    out = torch.empty_like(q) if out is None else out
    torch.ops.testbed_cpu.paged_decode(
        out,
        q,
        k_cache,
        v_cache,
        block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        scale,
    )
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """Same contract as reference.write_kv_ref (slot -1 = not written); k/v may be strided views."""
    load()
    torch.ops.testbed_cpu.write_kv(k, v, k_cache, v_cache, slot_mapping.to(torch.int64).contiguous())


def decode_attention(q, k, v, k_cache, v_cache, slot_mapping, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """write_kv then paged_decode, in one call (a pure decode step)."""
    load()
    return torch.ops.testbed_cpu.decode_attention(
        q,
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping.to(torch.int64).contiguous(),
        block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        scale,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Same contract as reference.rms_norm_ref: normed(x), or (normed(x + residual), x + residual)."""
    load()
    if residual is None:
        return torch.ops.testbed_cpu.rms_norm(x.contiguous(), weight, eps)
    return torch.ops.testbed_cpu.add_rms_norm(x.contiguous(), residual.contiguous(), weight, eps)


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Neox-style rotary embedding, same contract as reference.rotary_ref; q/k may be strided views."""
    load()
    return torch.ops.testbed_cpu.rotary(positions.to(torch.int64).contiguous(), q, k, cos_sin_cache)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias): float32 inputs of up to FEW_ROWS rows go to linear.cpp's few-rows kernel
    (weights streamed once, batch invariant), anything else to torch's GEMM."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() != 2 or x.shape[0] > FEW_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    load()
    return torch.ops.testbed_cpu.linear_rows(x.contiguous(), weight, bias)
