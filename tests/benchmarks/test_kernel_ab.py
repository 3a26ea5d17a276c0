"""benchmarks.kernel_ab: a side's process reports both cases with a hash of its outputs, the same hash on a
second run (fixed seeds: what makes "bit-identical" meaningful); the whole A/B against HEAD (slow: it builds
HEAD's kernels in a git worktree) writes its table and finds a clean tree identical to HEAD."""

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


def side(tree: Path) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.kernel_ab", "--child", str(tree), "--threads", "1", "--repeats", "1"]
    proc = subprocess.run(cmd + ["--layers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_side_reports_both_cases_and_hashes_its_outputs_reproducibly():
    first, second = side(ROOT), side(ROOT)
    assert set(first) == {"decode", "prefill"}
    assert first["decode"]["ms"] > 0 and first["decode"]["GBps"] > 0 and first["decode"]["sum_GBps"] > 0
    assert first["prefill"]["ms"] > 0 and first["prefill"]["GFLOPs"] > 0
    assert [first[c]["sha1"] for c in first] == [second[c]["sha1"] for c in first]


def test_unknown_baseline_is_named(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.kernel_ab", "--baseline", "no-such-revision", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no git revision 'no-such-revision'" in proc.stderr


@pytest.mark.slow
def test_ab_against_head_writes_the_table(tmp_path):
    git_status = ["git", "status", "--porcelain", "testbed_kernels/cpu"]
    dirty = subprocess.run(git_status, cwd=ROOT, capture_output=True, text=True)
    cmd = [sys.executable, "-m", "benchmarks.kernel_ab", "--baseline", "HEAD", "--rounds", "1", "--repeats", "1"]
    cmd += ["--layers", "2", "--threads", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads((tmp_path / "kernel_ab.json").read_text())["runs"]
    assert [len(runs["baseline"]), len(runs["this tree"])] == [1, 1]
    table = (tmp_path / "kernel_ab.md").read_text()
    assert "| decode attention |" in table and "| prefill attention |" in table
    if not dirty.stdout.strip():  # the kernels are HEAD's: both builds must agree bit for bit
        assert runs["baseline"][0]["decode"]["sha1"] == runs["this tree"][0]["decode"]["sha1"]
        assert runs["baseline"][0]["prefill"]["sha1"] == runs["this tree"][0]["prefill"]["sha1"]
