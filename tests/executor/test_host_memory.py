"""keep_freed_memory: a CPU step's freed activations are reused, not faulted in again every step."""

import subprocess
import sys

import pytest

# Step-like rounds: activations of 1-8 MB allocated, written and some freed out of order (a seeded pattern);
# prints the minor page faults of the last 20 rounds.
_LOOP = """
import random, resource, sys, torch
if sys.argv[1] == "keep":
    from testbed.executor.host_memory import keep_freed_memory
    assert keep_freed_memory()
rng = random.Random(0)
def step():
    live = []
    for _ in range(8):
        live.append(torch.empty(rng.randint(1, 8) << 18).fill_(1.0))
        if rng.random() < 0.5:
            live.pop(rng.randrange(len(live)))
for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _LOOP, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_activations_are_reused_instead_of_faulted_in_again():
    kept, default = _faults("keep"), _faults("default")
    # default glibc: ~34k faults (each round's activations mapped in afresh); kept: ~3k (the heap's growth)
    assert kept * 5 < default, f"{kept} minor faults with the memory kept vs {default} without"
