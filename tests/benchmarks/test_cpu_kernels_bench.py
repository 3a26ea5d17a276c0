"""benchmarks.cpu_kernels: both A/Bs run (the linear one in a process per mode, interleaved) and the files
land where it says, with the two prefill paths agreeing. Its main runs in this process (the parent's own
process only adds a start-up); the per-mode children are processes as in a real run."""

import json
import shutil

import pytest

from benchmarks.cpu_kernels import main

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="kernel=cpu builds its kernels with a C++ compiler",
)


def test_cpu_kernels_bench_writes_both_ab(tmp_path, keep_torch_threads):
    args = ["--threads", "1", "--repeats", "2", "--rounds", "2", "--batch-pairs", "100000"]  # 1/20 of the calls
    args += ["--layers", "2", "--rows", "1", "4", "--prefill", "40/40", "16/70", "--out", str(tmp_path)]
    assert main(args) == 0
    result = json.loads((tmp_path / "cpu_kernels.json").read_text())
    assert [(r["q_len"], r["ctx_len"]) for r in result["prefill"]] == [(40, 40), (16, 70)]
    assert all(r["max_abs_diff"] < 1e-4 and r["flash_ms"] > 0 for r in result["prefill"])
    modes = [(r["mode"], r["round"]) for r in result["linear"]]
    assert modes == [
        ("packed", 1),
        ("packed-no-prefetch", 1),
        ("torch", 1),
        ("torch", 2),
        ("packed-no-prefetch", 2),
        ("packed", 2),
    ]
    assert all(set(r["seconds"]) == {"1", "4"} for r in result["linear"])
    assert "| 16 / 70 |" in (tmp_path / "cpu_kernels.md").read_text()
