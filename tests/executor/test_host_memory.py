"""keep_freed_memory: a CPU step's freed activations are reused, not faulted in again every step."""

import json
import subprocess
import sys

import pytest

# A fresh process mallocs a 16 MiB activation, writes it, frees it, then does it again; it prints where glibc
# put the block (mallinfo2: mmapped bytes, free heap bytes kept after the free) and the minor page faults of the
# second round. Fault counts of a whole torch step swing several-fold with glibc's adaptive thresholds, so
# the test looks at one block, where glibc's behaviour is fixed.
_ROUNDS = """
import ctypes, json, resource, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print(json.dumps(None))
    sys.exit()
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "keep":
    from testbed.executor.host_memory import keep_freed_memory
    assert keep_freed_memory()
size = 16 << 20
before = libc.mallinfo2()
block = libc.malloc(size)
ctypes.memset(block, 1, size)
mmapped = libc.mallinfo2().hblkhd - before.hblkhd
libc.free(block)
kept = libc.mallinfo2().fordblks  # free bytes the heap holds (arena growth alone misses a top chunk's slack)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = libc.malloc(size)
ctypes.memset(block, 1, size)
refaults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"mmapped": mmapped, "kept": kept, "refaults": refaults}))
"""


def _rounds(mode: str) -> dict | None:
    out = subprocess.run([sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.split("\n")[-2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_activations_are_reused_instead_of_faulted_in_again():
    kept, default = _rounds("keep"), _rounds("default")
    if kept is None:
        pytest.skip("this C library has no mallinfo2 (glibc >= 2.33)")
    pages = (16 << 20) // 4096
    # glibc's defaults: a fresh mapping for the block, unmapped on free, so the next one faults in again
    assert default["mmapped"] >= 16 << 20 and default["kept"] < 16 << 20 and default["refaults"] >= pages // 2
    # kept: the block comes from the heap, stays there after the free and is reused without a fault
    assert kept["mmapped"] == 0 and kept["kept"] >= 16 << 20 and kept["refaults"] < pages // 20, kept
