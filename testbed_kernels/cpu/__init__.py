"""C++ CPU kernels (`kernel=cpu`), built on first use with torch's extension builder and cached.

The build needs a C++ compiler (g++) and ninja; the result is cached under TORCH_EXTENSIONS_DIR
(default ~/.cache/torch_extensions), so only the first process pays the compile (~45 s on the 2-core Xeon VM).
"""

import fcntl
import hashlib
import platform
import shutil
import time
from functools import cache
from pathlib import Path

import torch

_SOURCES = [
    Path(__file__).with_name(name)
    for name in ("paged_decode.cpp", "paged_prefill.cpp", "layer_ops.cpp", "linear.cpp", "decode_layers.cpp")
]
# linear(): rows up to this many go to the packed-weight kernel (linear.cpp), more to torch's GEMM; the
# kernel was ahead of torch's GEMM from 8 to 128 rows on SmolLM2's layers (results/kernels/cpu_kernels.md)
FEW_ROWS = 128


def _build_tag() -> str:
    """The build uses -march=native: a home directory shared by different CPUs (a Slurm cluster) must not
    hand one CPU's build to another, so the extension's name carries a hash of this CPU's feature flags, and
    of the sources, so that checkouts with different kernels (an A/B of a kernel change) each keep their own
    build instead of rebuilding over each other's."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.machine() + platform.processor()
    digest = hashlib.sha1(flags.encode())
    for source in sorted(Path(__file__).parent.glob("*.[ch]*")):
        digest.update(source.name.encode() + source.read_bytes())
    return digest.hexdigest()[:10]


def _stable_sources(src: Path) -> list[Path]:
    """The sources copied into the build folder, so that every checkout of the same kernels (git worktrees,
    an installed copy) writes the same build.ninja and reuses one build instead of recompiling over the
    others' (ninja rebuilds when a source's path changes). The folder's name already hashes the contents."""
    src.mkdir(parents=True, exist_ok=True)
    for source in Path(__file__).parent.glob("*.[ch]*"):
        target = src / source.name
        if not target.exists() or target.read_bytes() != source.read_bytes():
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_bytes(source.read_bytes())
            tmp.replace(target)
    return [src / s.name for s in _SOURCES]


@cache
def load() -> float:
    """Compile (once per machine) and load the extension; its ops then live under torch.ops.testbed_cpu.
    Returns the seconds this took (a compile shows as tens of seconds, a cached build as well under one)."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise RuntimeError(
            "kernel=cpu needs a C++ compiler (g++) to build its kernels; install one or use kernel=torch"
        )
    import sys

    from torch.utils.cpp_extension import _get_build_directory
    from torch.utils.cpp_extension import load as build

    name = f"testbed_cpu_kernels_{_build_tag()}"
    folder = Path(_get_build_directory(name, verbose=False))
    if not any(folder.glob("*.so")):  # progress for the one-off compile; an up-to-date build says nothing
        print(f"[testbed] kernel=cpu: compiling its C++ kernels into {folder} (once, ~1 min)", file=sys.stderr)
    start = time.perf_counter()
    # torch's own build lock is a file that a killed build leaves behind, after which every later process
    # waits on it forever; an flock dies with its holder, so whoever holds it knows no build is running
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        sources = _stable_sources(folder / "src")
        try:
            build(
                name=name,
                sources=[str(s) for s in sources],
                extra_include_paths=[str(folder / "src")],
                is_python_module=False,
                extra_cflags=["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        except (RuntimeError, OSError) as e:
            raise RuntimeError(f"kernel=cpu: building its C++ kernels failed (use kernel=torch meanwhile): {e}") from e
    seconds = time.perf_counter() - start
    if seconds > 5:
        print(f"[testbed] kernel=cpu: C++ kernels ready after {seconds:.0f} s (cached from now on)", file=sys.stderr)
    return seconds


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


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    chunks: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of query chunks over their paged KV (paged_prefill.cpp). chunks: [n, 4] int rows
    (sequence's row in block_tables, first row of q, number of rows, context length incl. those rows); each
    chunk's queries are the last tokens of its context, already written to the cache. Rows of q in no chunk
    are left as they are in `out` (uninitialised when out is None)."""
    load()
    out = torch.empty_like(q) if out is None else out
    torch.ops.testbed_cpu.paged_prefill(
        out,
        q,
        k_cache,
        v_cache,
        block_tables.to(torch.int32).contiguous(),
        chunks.to(torch.int64).contiguous(),
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


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same contract as reference.silu_and_mul_ref: x = [..., 2*d] (gate | up) -> silu(gate) * up."""
    load()
    return torch.ops.testbed_cpu.silu_and_mul(x.contiguous())


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Neox-style rotary embedding, same contract as reference.rotary_ref; q/k may be strided views."""
    load()
    return torch.ops.testbed_cpu.rotary(positions.to(torch.int64).contiguous(), q, k, cos_sin_cache)


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """A float32 [N, K] weight in linear.cpp's panel layout, for linear(..., packed=): a copy, made once."""
    load()
    return torch.ops.testbed_cpu.pack_linear(weight.contiguous())


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight.T (+ bias): float32 inputs of up to FEW_ROWS rows go to linear.cpp's few-rows kernel on
    `packed` (pack_linear(weight); weights streamed once, batch invariant), anything else, and everything
    when `packed` is None, to torch's GEMM on `weight`."""
    if packed is None or x.dtype != torch.float32 or x.dim() != 2 or x.shape[0] > FEW_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    load()
    return torch.ops.testbed_cpu.linear_packed(x.contiguous(), packed, weight.shape[0], bias)


def decode_layers(hidden, positions, meta_tensors, cos_sin, weights, kv_caches, shape, few_rows: int):
    """A pure decode step's decoder layers in one C++ call (decode_layers.cpp); see CpuBackend.decode_layers.
    meta_tensors: (slot_mapping, block_tables, seq_lens); shape: (num_heads, num_kv_heads, head_dim, eps, scale);
    weights: 13 entries per layer (decode_layers.cpp's Weight order); kv_caches: k, v per layer.
    Returns (hidden, residual) after the last layer."""
    load()
    slots, tables, seq_lens = meta_tensors
    return torch.ops.testbed_cpu.decode_layers(
        hidden, None, positions, slots, tables, seq_lens, cos_sin, weights, kv_caches, *shape, few_rows
    )
