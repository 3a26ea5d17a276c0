"""Keep CPython's cyclic garbage collector off what a run holds for a whole phase.

A full collection walks every tracked object and every reference it holds. A replay holds millions of
references for its whole length (the trace's prompts, the requests' token lists, the recorded rows), and
building the result tables allocates enough to set off several full collections, each walking all of it
(in a 3,000-request simulation, 6 full collections while the tables were written cost about as much CPU
as the simulated run itself). `gc.freeze()` moves every object alive now into a permanent generation the
collector skips, as serving engines do after start-up (vLLM and Instagram's Django freeze theirs); it
frees nothing and changes no result. Leaving the block unfreezes them, so a process that lives on (a
multirun worker, a notebook) collects them as usual.
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Freeze what is alive on entry (call gc.freeze() again at a later phase boundary); unfreeze on exit."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
