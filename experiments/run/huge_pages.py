"""numpy's huge-page advice off while a run holds and tables its records.

numpy asks the kernel for transparent huge pages (madvise) for every array of 4 MiB or more; where THP is
`madvise` with defrag `madvise` (our VMs), each first touch of such a page is a synchronous 2 MiB
allocation, compaction included. A simulated run's tables make many such arrays once each (the steps
table's columns, their temporaries), which never live long enough to gain from huge pages: in the
10,000-request simulation benchmark, its system time halved without the advice (1.09-1.12 -> 0.54-0.62 s,
THP faults 88 -> 43; the steps table 0.89-0.95 -> 0.55-0.75 s wall; two pairs on the shared VM, relative).
This is what NUMPY_MADVISE_HUGEPAGE=0 sets at numpy's import, through the same numpy function, for the
block only; results are the same either way (only how memory is backed changes)."""

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def madvise_switch() -> Callable[[bool], bool] | None:
    """numpy's setter of its huge-page advice (returns the previous setting); None if this numpy has none."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2, numpy 1
        try:
            return getattr(importlib.import_module(module), "_set_madvise_hugepage", None)
        except ImportError:
            continue
    return None


@contextmanager
def numpy_small_pages() -> Iterator[None]:
    """numpy advises no huge pages inside the block; its previous setting comes back on exit (a numpy
    without the switch: nothing changes)."""
    switch = madvise_switch()
    if switch is None:
        yield
        return
    previous = switch(False)
    try:
        yield
    finally:
        switch(previous)
