"""Result files are replaced atomically: a writer killed at a random point (SIGKILL, no clean-up) leaves
the previous complete file or the new complete file, never a truncated one; a reader running alongside
the writer never sees a torn file either; a run folder holding summary.json is complete and consistent;
sweep.csv loses no row and gains no torn row, even when killed while it is being rewritten."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from experiments.results.atomic import atomic_open, atomic_write_bytes, atomic_write_text
from experiments.results.files import load_run, read_parquet, read_sweep, write_run

from ..runner.helpers import ROOT
from .atomic_writer import BASE_ROWS


def _check_frame(path, what: str) -> tuple[int, int] | None:
    """(run, version) of a complete parquet written by atomic_writer, None if absent; fails on a torn one."""
    try:
        df = read_parquet(path)  # a truncated parquet raises here ("magic bytes not found")
    except FileNotFoundError:
        return None
    run, version = int(df["run"].iloc[0]), int(df["version"].iloc[0])
    assert len(df) == BASE_ROWS + version, f"{what}: {len(df)} rows for version {version}"
    assert (df["run"] == run).all() and (df["version"] == version).all(), what
    return run, version


def _check_json(path) -> tuple[int, int] | None:
    try:
        data = json.loads(path.read_text())  # a truncated file raises here
    except FileNotFoundError:  # not written yet, or removed while its folder is rewritten
        return None
    assert data["rows"] == BASE_ROWS + data["version"]
    return data["run"], data["version"]


def _check_sweep(table, finished_runs: dict[int, int] | None = None) -> dict[int, int]:
    """Per writer run, the versions in the table are 0..m-1 (nothing lost, nothing doubled, nothing torn)."""
    if not table.exists():
        return {}
    df = read_sweep(table, include_incomplete=True)
    if df.empty:  # a writer killed between creating the table and writing its first row
        df = pd.DataFrame({"run": [], "version": [], "payload": []})
    assert df["payload"].eq("x" * 200).all(), "a torn row"
    counts = {}
    for run, group in df.groupby("run"):
        versions = sorted(int(v) for v in group["version"])
        assert versions == list(range(len(versions))), f"run {run}: versions {versions[:5]}...{versions[-5:]}"
        counts[int(run)] = len(versions)
    for run, written in (finished_runs or {}).items():  # every row a killed writer completed is there
        assert counts.get(run, 0) >= written
    return counts


def _check_folder(folder, *, at_rest: bool) -> None:
    run_dir = folder / "run"
    requests = _check_frame(run_dir / "requests.parquet", "requests")
    steps = _check_frame(run_dir / "steps.parquet", "steps")
    report = _check_json(run_dir / "trace_report.json")
    summary = _check_json(run_dir / "summary.json")
    if at_rest and summary is not None:  # summary.json present: every file is from that same write
        assert requests == steps == report == summary
        assert (run_dir / "config.yaml").read_text() == f"run: {summary[0]}\nversion: {summary[1]}\n"
        load_run(run_dir)
    _check_sweep(folder / "sweep.csv")


def _kill_loop(folder, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    for run in range(kills):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.atomic_writer", str(folder), str(run)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + rng.uniform(0.05, 1.5)
        reads = 0
        while time.monotonic() < deadline:  # read alongside the writer: never a torn file
            _check_folder(folder, at_rest=False)
            reads += 1
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        assert writer.returncode == -signal.SIGKILL
        _check_folder(folder, at_rest=True)
        assert reads > 0
    counts = _check_sweep(folder / "sweep.csv")
    assert sum(counts.values()) > 0, "the writer never got a row in: kill later"


def test_killed_writer_leaves_complete_files(tmp_path):
    _kill_loop(tmp_path, kills=4, seed=0)


@pytest.mark.slow
def test_killed_writer_leaves_complete_files_long(tmp_path):
    _kill_loop(tmp_path, kills=60, seed=1)


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_text(path, '{"old": true}')
    with pytest.raises(RuntimeError), atomic_open(path, "w") as f:
        f.write('{"new": ')
        raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"old": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # the temporary file is gone


def test_atomic_files_get_the_usual_permissions(tmp_path):
    old = os.umask(0o022)
    os.umask(old)
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o666 & ~old


def test_rewritten_run_folder_reads_incomplete_until_summary(tmp_path, monkeypatch):
    frame = pd.DataFrame({"a": [1]})
    write_run(tmp_path, config_yaml="a: 1\n", requests=frame, steps=frame, summary={"v": 1})
    import experiments.results.files as results

    def dies(path, data):
        raise KeyboardInterrupt  # stopped while the new files are being written

    monkeypatch.setattr(results, "write_parquet", dies)
    with pytest.raises(KeyboardInterrupt):
        write_run(tmp_path, config_yaml="a: 2\n", requests=frame, steps=frame, summary={"v": 2})
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        load_run(tmp_path)
