"""Result files of one run and the sweep-level table every run appends to.

    <run_dir>/config.yaml        the resolved config
    <run_dir>/requests.parquet   one row per request (experiments.recorder.REQUEST_COLUMNS)
    <run_dir>/steps.parquet      one row per engine step
    <run_dir>/summary.json       metrics (vLLM bench serve key names where one exists) + run info
    <run_dir>/trace_report.json  what the trace loader read, skipped and clipped
    <sweep table>                one CSV row per run: run info, swept config values, summary scalars

The sweep table is <run_dir>/../sweep.csv by default: a Hydra multirun's sweep dir, or the experiment's
folder for single runs. Appends hold an exclusive lock on the table (runs of a Slurm array may finish
together); a row with new columns rewrites the table with the union of columns.
"""

from __future__ import annotations

import fcntl
import io
import json
import math
import os
from pathlib import Path

import pandas as pd

SWEEP_TABLE = "sweep.csv"


def _json_default(obj):
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


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
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def write_run(
    run_dir: Path,
    *,
    config_yaml: str,
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    summary: dict,
    trace_report: dict | None = None,
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    requests.to_parquet(run_dir / "requests.parquet", index=False)
    steps.to_parquet(run_dir / "steps.parquet", index=False)
    if trace_report is not None:
        write_json(run_dir / "trace_report.json", trace_report)
    write_json(run_dir / "summary.json", summary)  # last: its presence marks a complete write


def load_run(run_dir: str | Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(summary, requests, steps) of one run folder."""
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, pd.read_parquet(run_dir / "requests.parquet"), pd.read_parquet(run_dir / "steps.parquet")


def sweep_row(summary: dict, info: dict) -> dict:
    """Run info first, then every scalar of the summary."""
    row = dict(info)
    for k, v in summary.items():
        if k not in row and (v is None or isinstance(v, (bool, int, float, str))):
            row[k] = v
    return row


def append_sweep_row(table: Path, row: dict) -> None:
    """Append one row under an exclusive lock on the table itself (no lock file is left behind)."""
    table.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([_clean(row)])
    with open(table, "a+", newline="") as f:  # O_APPEND: every write goes to the end
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        if not text.strip():
            new.to_csv(f, index=False)
            return
        header = pd.read_csv(io.StringIO(text), nrows=0).columns.tolist()
        if set(new.columns) <= set(header):
            new.reindex(columns=header).to_csv(f, header=False, index=False)
            return
        merged = pd.concat([pd.read_csv(io.StringIO(text)), new], ignore_index=True)  # new columns
        f.truncate(0)
        merged.to_csv(f, index=False)


def read_sweep(path: str | Path) -> pd.DataFrame:
    """A sweep table, from its CSV or the folder holding it."""
    path = Path(path)
    return pd.read_csv(path / SWEEP_TABLE if path.is_dir() else path)
