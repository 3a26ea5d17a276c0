"""Host memory for CPU steps: keep the memory a step frees for the next step (glibc's malloc only).

A CPU step allocates and frees activations of a few MB each (a 512-token chunk's MLP input is 6 MB). glibc
serves blocks above its mmap threshold (128 KiB at first, rising as frees are seen) with fresh mappings and
unmaps them on free, and trims the heap's free top back to the system, so each step faults its activations
in again. Fixing the threshold at glibc's maximum (32 MiB) and trimming only above 1 GiB lets freed blocks be
reused, as tcmalloc and jemalloc (which CPU inference stacks preload) do by default: on the cpu-shape
workload at 32 sequences (benchmarks/page_faults.py, results/host_overhead/page_faults.md, 2-core Xeon VM)
148k-233k minor faults per run fall to 7.8k-9.0k; the run's time did not change beyond that machine's noise
(16.4-22.4 s kept vs 17.8-20.1 s, 4 runs each). The cost: a CPU engine process keeps up to ~1 GiB it no
longer uses.
"""

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Apply the settings above to this process; False (and nothing changed) where the C library is not
    glibc or refuses them."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):  # glibc only: musl and others ignore these settings
            return False
    except (OSError, AttributeError, TypeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        logger.info("mallopt refused the host-memory settings; CPU steps will page-fault their activations")
    return ok
