"""kernel=cpu's 8-float (AVX2) code paths, on a machine whose -march=native would pick AVX-512: the kernels
are built once more with -mno-avx512f, in a child process (the two builds register the same ops), and
checked there against torch: the packed linear kernel (also batch invariant) and the paged decode and
prefill attention kernels (one query head per dots8 call there, 8-float tiles). Slow: a second compile of
every kernel (~45 s on 2 cores)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_CHECK = """
import glob, sys, torch
from torch.utils.cpp_extension import load
folder = sys.argv[1]
load(name="testbed_cpu_no_avx512", sources=sorted(glob.glob(folder + "/*.cpp")), extra_include_paths=[folder],
     is_python_module=False, extra_cflags=["-O3", "-march=native", "-mno-avx512f", "-ffp-contract=fast", "-fopenmp"],
     extra_ldflags=["-fopenmp"])
gen = torch.Generator().manual_seed(0)
worst = 0.0
for n, k in [(960, 576), (577, 573), (5, 16), (33, 7)]:
    w = torch.randn(n, k, generator=gen)
    packed = torch.ops.testbed_cpu.pack_linear(w)
    assert packed.shape[2] == 16, packed.shape  # 8-float vectors: 16-column panels
    for m in (1, 5, 6, 7, 13, 128):
        x, b = torch.randn(m, k, generator=gen), torch.randn(n, generator=gen)
        y = torch.ops.testbed_cpu.linear_packed(x, packed, n, b)
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
        worst = max(worst, ((y.double() - ref).abs().max() / ref.abs().max()).item())
        for i in range(m):
            assert torch.equal(torch.ops.testbed_cpu.linear_packed(x[i : i + 1], packed, n, b)[0], y[i]), (n, k, m, i)
sys.path.insert(0, sys.argv[2])
from testbed_kernels.reference import paged_attention_ref
for group, block in [(3, 16), (4, 5), (1, 8)]:
    lens = [1, 17, 64, 150]
    per_seq = max(lens) // block + 1
    k_cache, v_cache = (torch.randn(len(lens) * per_seq, block, 2, 64, generator=gen) for _ in range(2))
    tables = torch.randperm(len(lens) * per_seq, generator=gen).view(len(lens), per_seq).int()
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), 2 * group, 64, generator=gen)
    out = torch.empty_like(q)
    torch.ops.testbed_cpu.paged_decode(out, q, k_cache, v_cache, tables, seq_lens, 0.125)
    ref = paged_attention_ref(q.double(), k_cache.double(), v_cache.double(), torch.arange(len(lens) + 1),
                              seq_lens, tables, 0.125)
    worst = max(worst, ((out.double() - ref).abs().max() / ref.abs().max()).item())
    q_lens = [1, 9, 64, 100]  # chunks after a cached prefix, one whole prompt-sized chunk
    starts = [sum(q_lens[:i]) for i in range(len(lens) + 1)]
    q = torch.randn(starts[-1], 2 * group, 64, generator=gen)
    chunks = torch.tensor([[i, starts[i], q_lens[i], lens[i]] for i in range(len(lens))])
    out = torch.empty_like(q)
    torch.ops.testbed_cpu.paged_prefill(out, q, k_cache, v_cache, tables, chunks, 0.125)
    ref = paged_attention_ref(q.double(), k_cache.double(), v_cache.double(), torch.tensor(starts), seq_lens,
                              tables, 0.125)
    worst = max(worst, ((out.double() - ref).abs().max() / ref.abs().max()).item())
print(worst)
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="needs a C++ compiler")
def test_kernels_without_avx512_match_torch():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or "avx512f" not in cpuinfo.read_text():
        pytest.skip("no AVX-512 here: the default build already is the 8-float one")
    out = subprocess.run(
        [sys.executable, "-c", _CHECK, str(ROOT / "testbed_kernels" / "cpu"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.split()[-1]) < 1e-5
