"""Checks on the engine's configuration that need the machine (memory available now), as pure functions: a
value that cannot work is a ValueError naming what was wrong, before any work starts (a KV cache larger
than the machine would otherwise hang the constructor building billions of blocks). Each config group
checks its own fields (testbed.config). A request's checks are
testbed.input_processor's; this module imports nothing of the engine's, so any module may use it."""

from __future__ import annotations

import numbers
from pathlib import Path

GIB = 2**30


def is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    # a plain int first: the ABC check costs microseconds, and every request's params take a dozen
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def is_real(value) -> bool:
    """A real number (Python or numpy), not a bool."""
    kind = type(value)
    return kind is float or kind is int or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def available_host_bytes() -> int | None:
    """Memory the OS can give this process now without swapping (MemAvailable); None if unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _uses_cpu(device: str | None) -> bool:
    if device is not None:
        return str(device).startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def check_host_memory(config) -> None:
    """A KV cache of kv_cache_memory_gb allocated in host memory (the real engine on CPU) fits what is free."""
    gb = config.cache.memory_gb
    if config.cache.num_blocks is None and _uses_cpu(config.executor.device):
        available = available_host_bytes()
        if available is not None and gb * GIB > available:
            raise ValueError(
                f"kv_cache_memory_gb={gb:g} exceeds the {available / GIB:.1f} GiB of host memory available now; "
                f"lower it (or set num_blocks)"
            )


def check_kv_cache_fits(config, num_blocks: int, bytes_per_block: int, device) -> None:
    """The KV cache about to be allocated fits the device: host memory available now (CPU), free GPU memory
    (CUDA, when num_blocks was given; sized from free memory it fits by construction)."""
    need = num_blocks * bytes_per_block
    available: int | None
    if str(device).startswith("cuda"):
        if config.cache.num_blocks is None:
            return
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        where, available = "free GPU memory", free
    else:
        where, available = "host memory available now", available_host_bytes()
    if available is not None and need > available:
        raise ValueError(
            f"a KV cache of {num_blocks} blocks x {bytes_per_block} bytes = {need / GIB:.1f} GiB does not fit in the "
            f"{available / GIB:.1f} GiB of {where}; lower num_blocks or kv_cache_memory_gb"
        )
