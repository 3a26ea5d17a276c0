"""benchmarks.cpu_kernels: both A/Bs run (the linear one in a process per mode, interleaved) and the files
land where it says, with the two prefill paths agreeing."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="kernel=cpu builds its kernels with a C++ compiler",
)


def test_cpu_kernels_bench_writes_both_ab(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.cpu_kernels", "--threads", "1", "--repeats", "2", "--rounds", "2"]
    cmd += ["--layers", "2", "--rows", "1", "4", "--prefill", "40/40", "16/70", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
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
