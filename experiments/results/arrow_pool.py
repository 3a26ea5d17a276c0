"""The memory arrow allocates from while a run's result tables are made and written: the C library's malloc
(`pyarrow.system_memory_pool`) instead of pyarrow's default, its bundled mimalloc.

mimalloc backs its arenas with transparent huge pages (THP is `madvise` on our VMs): writing one 10,000-row
requests table took ~300 huge-page faults (/proc/vmstat thp_fault_alloc), each zeroing 2 MiB on first touch,
and on the shared VM the results of a 10,000-request simulation cost ~1 s of system time that way, against
~0.05 s with malloc for the same user time (loaded machine, relative). The tables and files are the same
either way: only where arrow's buffers live changes. Arrow's own setting, not a home-made allocator."""

from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa


@contextmanager
def system_memory_pool() -> Iterator[None]:
    """Arrow allocates from malloc inside the block (every buffer is freed to the pool it came from, so
    tables made inside may outlive it); the previous default pool comes back on exit."""
    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
