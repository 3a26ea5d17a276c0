"""Host memory for CPU steps: keep the memory a step frees for the next step (glibc's malloc only), and
back the KV cache with 2 MiB pages.

A CPU step allocates and frees activations of a few MB each (a 512-token chunk's MLP input is 6 MB). glibc
serves blocks above its mmap threshold (128 KiB at first, rising as frees are seen) with fresh mappings and
unmaps them on free, and trims the heap's free top back to the system, so each step faults its activations
in again. Fixing the threshold at glibc's maximum (32 MiB) and trimming only above 1 GiB lets freed blocks be
reused, as tcmalloc and jemalloc (which CPU inference stacks preload) do by default; the minor faults
this saves and the (unchanged) run time: benchmarks/page_faults.py, results/host_overhead/README.md. The
cost: a CPU engine process keeps up to TRIM_THRESHOLD (1 GiB) it no longer uses.

The KV cache (GBs, read a few KB per block from all over it at every decode step) on 4 KiB pages costs a
TLB miss, and a page walk, per page a step touches; Linux's transparent huge pages are commonly in
`madvise` mode, so a region must ask for them. The gain is for block tables scattered over the pool (as
they become in a long-running server), none for contiguous ones, and small against a shared machine's
noise: `python -m benchmarks.kv_pages`, results/kernels/README.md. The packed weights, read front to
back, showed none.
"""

import ctypes
import ctypes.util
import logging
import math
import mmap

import torch

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


HUGE_PAGE = 2 << 20


def zeros_on_huge_pages(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor in its own anonymous mapping, aligned to 2 MiB and advised MADV_HUGEPAGE, so
    that where transparent huge pages are enabled (`always` or `madvise`) it is backed by 2 MiB pages; where
    they are not (or the platform has no madvise), an ordinary zero tensor. Faulted in here, not mid-run."""
    nbytes = math.prod(shape) * dtype.itemsize
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advise is None:
        return torch.zeros(shape, dtype=dtype)
    # private anonymous (a shared one is shmem, whose huge pages are a separate, usually disabled, setting);
    # page-aligned, with slack to start on a 2 MiB boundary
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = torch.frombuffer(region, dtype=torch.uint8)  # holds a reference to `region`: unmapped with the tensor
    start = -buf.data_ptr() % HUGE_PAGE
    try:
        region.madvise(advise, start, nbytes - nbytes % mmap.PAGESIZE)
    except OSError as e:  # THP compiled out or disabled: 4 KiB pages, same contents
        logger.info("KV cache on 4 KiB pages (madvise MADV_HUGEPAGE refused: %s)", e)
    tensor = buf[start : start + nbytes].view(dtype).view(shape)
    tensor.zero_()  # already zero; the write faults the pages in now, not during a measured step
    return tensor
