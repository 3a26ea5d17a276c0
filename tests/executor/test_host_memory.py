"""keep_freed_memory: a CPU step's freed activations are reused, not faulted in again every step."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def _anon_huge_kb(address: int) -> int | None:
    """AnonHugePages (kB) of the mapping holding `address`, from /proc/self/smaps; None where unreadable."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return None


def _thp_mode() -> str | None:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_on_host_is_zero_aligned_and_on_huge_pages(dtype):
    from testbed.executor.host_memory import HUGE_PAGE, zeros_on_huge_pages

    shape = (300, 16, 3, 64)  # 3.5 MiB in fp32, 1.8 MiB in bf16
    t = zeros_on_huge_pages(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and not t.any()
    t[7, 3, 1, 5] = 2.0  # writable, and a plain tensor to torch
    assert t.sum().item() == 2.0
    if t.numel() * dtype.itemsize < HUGE_PAGE:
        return  # too small to hold a huge page: an ordinary tensor
    assert t.data_ptr() % HUGE_PAGE == 0
    if _thp_mode() in ("always", "madvise"):
        huge = _anon_huge_kb(t.data_ptr())
        assert huge is None or huge >= HUGE_PAGE // 1024, f"no 2 MiB page backs the cache ({huge} kB)"


def test_allocate_kv_cache_on_cpu_gives_each_layer_its_own_aligned_zero_memory():
    from types import SimpleNamespace

    from testbed.executor.host_memory import HUGE_PAGE
    from testbed.executor.kv_cache import allocate_kv_cache

    arch = SimpleNamespace(num_key_value_heads=3, head_dim=64)
    caches = allocate_kv_cache(arch, 400, 16, 2, torch.float32, "cpu")
    assert len(caches) == 2 and all(k.shape == (400, 16, 3, 64) for k, _ in caches)
    assert all(t.data_ptr() % HUGE_PAGE == 0 and not t.any() for pair in caches for t in pair)
    assert len({t.data_ptr() for pair in caches for t in pair}) == 4  # each its own memory
