"""Result files of one run and the sweep-level table every run appends to.

    <run_dir>/config.yaml        the resolved config
    <run_dir>/requests.parquet   one row per request (experiments.results.recorder.REQUEST_COLUMNS)
    <run_dir>/steps.parquet      one row per engine step
    <run_dir>/summary.json       metrics (vLLM bench serve key names where one exists) + run info
    <run_dir>/trace_report.json  what the trace loader read, skipped and clipped
    <sweep table>                one CSV row per run: run info, swept config values, summary scalars

The sweep table is <run_dir>/../sweep.csv by default: a Hydra multirun's sweep dir, or the experiment's
folder for single runs. Appends hold an exclusive lock on the table (runs of a Slurm array may finish
together) and add their row with one write(2); a row with new columns rewrites the table with the union of
columns. Every whole-file write is atomic (experiments.results.atomic): a reader, or a run killed mid-write, sees
the previous complete file or the new one. summary.json is written last and removed first when a folder is
rewritten, so a run folder holding summary.json is complete. Interrupted or failed runs keep their row
(`interrupted`, `error` columns); `read_sweep` leaves them out unless asked.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from experiments.results.arrow_pool import system_memory_pool
from experiments.kv_whatif.stream import FILE as ACCESS_FILE
from experiments.results.atomic import atomic_write_text, atomic_write_with, fsync_dir
from experiments.results.list_columns import frame_table

SWEEP_TABLE = "sweep.csv"
# result files a run writes only sometimes (write_run: trace_report, clock, the replays' `tables`): a run
# rewriting a folder removes an earlier run's it does not write, which would sit beside a summary not theirs
OPTIONAL_FILES = ("trace_report.json", "clock.parquet", ACCESS_FILE, "turns.parquet")


def _json_default(obj):
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    return str(obj)  # a Path, a dtype, ...: a result file is written whole rather than lost


def _clean(obj):
    """NaN/inf -> None so summary.json is strict JSON."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path, data) -> None:
    atomic_write_text(path, json.dumps(_clean(data), indent=2, default=_json_default) + "\n")


def write_parquet(path: Path, frame: pd.DataFrame | pa.Table) -> None:
    """A frame as `to_parquet(index=False)` writes it; an arrow table made as pandas makes it from a frame
    (`pa.Table.from_pandas`, e.g. experiments.kv_whatif.stream.access_table) as to_parquet then writes it."""
    if isinstance(frame, pa.Table):
        atomic_write_with(path, lambda f: pq.write_table(frame, f, compression="snappy"))  # to_parquet's default
    else:
        atomic_write_with(path, lambda f: frame.to_parquet(f, index=False))


def write_run(
    run_dir: Path,
    *,
    config_yaml: str,
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    summary: dict,
    trace_report: dict | None = None,
    clock: pd.DataFrame | None = None,
    tables: dict[str, pd.DataFrame | pa.Table] | None = None,
) -> None:
    """The run's files; arrow's buffers from malloc meanwhile (experiments.results.arrow_pool)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    summary_path = run_dir / "summary.json"
    if summary_path.exists():  # rewriting a folder: until the new summary lands, the folder reads incomplete
        summary_path.unlink()
        fsync_dir(run_dir)
    written = set(tables or ())
    written |= {"trace_report.json"} if trace_report is not None else set()
    written |= {"clock.parquet"} if clock is not None else set()
    for name in OPTIONAL_FILES:
        if name not in written:
            (run_dir / name).unlink(missing_ok=True)
    atomic_write_text(run_dir / "config.yaml", config_yaml)
    with system_memory_pool():
        write_parquet(run_dir / "requests.parquet", requests)
        write_parquet(run_dir / "steps.parquet", frame_table(steps))  # its list columns: one object per decode run
        if trace_report is not None:
            write_json(run_dir / "trace_report.json", trace_report)
        if clock is not None:  # every engine clock reading of a real run (replayed by executor.cost_model=replay_steps)
            write_parquet(run_dir / "clock.parquet", clock)
        for name, frame in (tables or {}).items():  # further tables of a run (turns.parquet of sessions)
            write_parquet(run_dir / name, frame)
    write_json(summary_path, summary)  # last: its presence marks a complete write


def load_run(run_dir: str | Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(summary, requests, steps) of one run folder."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").is_file():
        raise FileNotFoundError(f"{run_dir}: no summary.json: not a run folder, or its writer stopped before finishing")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, read_parquet(run_dir / "requests.parquet"), read_parquet(run_dir / "steps.parquet")


def read_parquet(path: Path) -> pd.DataFrame:
    """A parquet file read through one open handle: given a path, pyarrow opens it more than once, and a
    file replaced in between would be read half old, half new."""
    with open(path, "rb") as f:
        return pd.read_parquet(f)


def sweep_row(summary: dict, info: dict) -> dict:
    """Run info first, then every scalar of the summary."""
    row = dict(info)
    for k, v in summary.items():
        if k not in row and (v is None or isinstance(v, (bool, int, float, str))):
            row[k] = v
    return row


@contextlib.contextmanager
def _locked(table: Path) -> Iterator:
    """The table opened for appending (binary), under an exclusive flock of the file itself.

    A rewrite renames a new file over the table, so a writer that was waiting for the lock may hold the
    old, unlinked file: it checks after locking that its file is still the one at `table`, else retries."""
    while True:
        with open(table, "a+b") as f:  # O_APPEND: every write goes to the end; closing releases the lock
            fcntl.flock(f, fcntl.LOCK_EX)
            mine, current = os.fstat(f.fileno()), os.stat(table)
            if (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino):
                yield f
                return


def _append(f, text: str) -> None:
    """One write(2) of the whole row: a process killed here has appended all of it or none of it."""
    data = text.encode()
    written = os.write(f.fileno(), data)
    while written < len(data):  # a regular file takes it in one go; this is for odd filesystems
        written += os.write(f.fileno(), data[written:])
    os.fsync(f.fileno())


def append_sweep_row(table: Path, row: dict) -> None:
    """Append one row under an exclusive lock on the table itself (no lock file is left behind)."""
    table.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([_clean(row)])
    with _locked(table) as f:
        f.seek(0)
        first_line = f.readline().decode()
        if not first_line.strip():
            _append(f, new.to_csv(index=False))
            return
        header = pd.read_csv(io.StringIO(first_line), nrows=0).columns.tolist()
        if set(new.columns) <= set(header):
            f.seek(-1, os.SEEK_END)
            sep = "" if f.read(1) == b"\n" else "\n"  # after a torn write by an older writer, start a new line
            _append(f, sep + new.reindex(columns=header).to_csv(header=False, index=False))
            return
        f.seek(0)
        merged = pd.concat([pd.read_csv(f), new], ignore_index=True)  # new columns: rewrite the whole table
        atomic_write_text(table, merged.to_csv(index=False))


def _true(column: pd.Series) -> pd.Series:
    return column.astype(str).str.strip().str.lower() == "true"


def read_sweep(path: str | Path, include_incomplete: bool = False) -> pd.DataFrame:
    """A sweep table, from its CSV or the folder holding it. Runs that were interrupted (signal, Ctrl-C) or
    failed are left out unless include_incomplete: their figures cover only part of the workload."""
    path = Path(path)
    path = path / SWEEP_TABLE if path.is_dir() else path
    if path.stat().st_size == 0:  # created by append_sweep_row's open; its writer died before the first row
        return pd.DataFrame()
    table = pd.read_csv(path)
    if include_incomplete:
        return table
    partial = pd.Series(False, index=table.index)
    if "interrupted" in table:
        partial |= _true(table["interrupted"])
    if "error" in table:
        partial |= table["error"].notna() & (table["error"].astype(str).str.strip() != "")
    return table[~partial].reset_index(drop=True)
