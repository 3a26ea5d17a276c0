"""C++ CPU kernels (`kernel=cpu`), built on first use with torch's extension builder and cached.

The build needs a C++ compiler (g++) and ninja; the result is cached under TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions), so only the first process pays the ~30 s compile.
"""
from functools import cache
from pathlib import Path
import shutil

import torch

_SOURCES = [Path(__file__).with_name("paged_decode.cpp")]


@cache
def load() -> None:
    """Compile (once) and load the extension; its ops then live under torch.ops.testbed_cpu."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError("kernel=cpu needs a C++ compiler (g++) to build its kernels; install one or use kernel=torch")
    from torch.utils.cpp_extension import load as build
    build(name="testbed_cpu_kernels", sources=[str(s) for s in _SOURCES], is_python_module=False,
          extra_cflags=["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"], extra_ldflags=["-fopenmp"],
          verbose=False)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                 block_tables: torch.Tensor, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """One query token per sequence over its paged KV; same contract as reference.paged_attention_ref."""
    load()
    out = torch.empty_like(q) if out is None else out
    torch.ops.testbed_cpu.paged_decode(out, q, k_cache, v_cache, block_tables.to(torch.int32).contiguous(),
                                       seq_lens.to(torch.int32).contiguous(), scale)
    return out
