"""Keep CPython's cyclic garbage collector off what a run holds for a whole phase.

A full collection walks every tracked object and every reference it holds. A replay holds millions of
references for its whole length (the trace's prompts, the requests' token lists, the recorded rows), and
building the result tables allocates enough to set off several full collections, each walking all of it
(in a 3,000-request simulation, 6 full collections while the tables were written cost about as much CPU
as the simulated run itself). `gc.freeze()` moves every object alive now into a permanent generation the
collector skips, as serving engines do after start-up (vLLM and Instagram's Django freeze theirs); it
frees nothing and changes no result. Leaving the block unfreezes them, so a process that lives on (a
multirun worker, a notebook) collects them as usual.

While frozen, the young generation is collected every YOUNG_THRESHOLD allocations (net of frees) instead of
CPython's 700: a simulated replay allocates steadily (token lists, step records) and frees little of it, and a
young collection walks every young object and every reference it holds (a request's token lists: ~1,200 each
in the Azure trace). In a 10,000-request Azure simulation (llama-3.1-8b, gc.callbacks, same VM, one run each),
50,000 gave 12 young collections in the replay costing 0.58 s, 1,000,000 none (the replay allocates ~600,000
net); a longer run still collects, each young object walked about once either way, as at any threshold. At
CPython's 700 a 3,000-request simulation made 1,180 young, 106 middle and 8 full collections (~13% of its
CPU). Cyclic garbage waits at most that many allocations longer; the previous thresholds come back on exit.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 1_000_000


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Freeze what is alive on entry (call gc.freeze() again at a later phase boundary) and collect the young
    generation less often; unfreeze and restore the thresholds on exit."""
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], YOUNG_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
