"""The two sides of a comparison: which runs a folder holds (a run, a repeated run's or a sweep's table with
--where), how repeat i of A pairs with repeat i of B, and whether one side ran wholly before the other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments.results.files import SWEEP_TABLE, load_run, read_sweep
from experiments.statistics.aggregate import group_key


class CompareError(ValueError):
    pass


@dataclass
class Run:
    path: Path
    repeat: int  # the replicate: repeat index, or seed in a seed sweep
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame


def parse_where(where: list[str] | None) -> dict[str, str]:
    out = {}
    for item in where or []:
        if "=" not in item:
            raise CompareError(f"--where expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = value
    return out


def load_side(path: str | Path, where: dict[str, str] | None = None) -> list[Run]:
    """The runs of one side: a run folder, or the runs of one configuration in a (repeated run's) sweep table."""
    path = Path(path)
    if (path / SWEEP_TABLE).exists():
        return _sweep_runs(path, where)
    if (path / "summary.json").exists():
        if where:
            raise CompareError(f"{path}: --where applies to a sweep folder; this is a single run")
        summary, requests, steps = load_run(path)
        return [Run(path, int(summary.get("repeat") or 0), summary, requests, steps)]
    raise CompareError(f"{path}: neither a run folder (summary.json) nor a sweep or repeated run ({SWEEP_TABLE})")


def _sweep_runs(path: Path, where: dict[str, str] | None) -> list[Run]:
    table = read_sweep(path)
    for key, value in (where or {}).items():
        if key not in table:
            raise CompareError(f"--where {key}: no such column in {path / SWEEP_TABLE}")
        table = table[table[key].astype(str) == value]
    if table.empty:
        raise CompareError(f"{path}: no complete runs match {where or 'its sweep table'}")
    keys = group_key(table)
    if keys.nunique() > 1:
        varying = [c for c in table.columns if "." in c and table[c].astype(str).nunique() > 1]
        raise CompareError(
            f"{path} holds {keys.nunique()} configurations (differing in {varying}); pick one with --where KEY=VALUE"
        )
    # which replicate a run is: its repeat index, or its seed in a seed sweep (every repeat index 0)
    replicate = list(range(len(table)))
    for column in ("repeat", "seed"):
        if column in table and table[column].notna().all() and table[column].is_unique:
            replicate = [int(v) for v in table[column]]
            break
    runs = []
    for rep, row in zip(replicate, table.itertuples(index=False)):
        run_dir = path / str(row.run_dir)
        summary, requests, steps = load_run(run_dir)
        runs.append(Run(run_dir, rep, summary, requests, steps))
    return sorted(runs, key=lambda r: r.repeat)


def one_after_the_other(a: list[Run], b: list[Run]) -> tuple[str, str] | None:
    """("A", "B") when all of A's runs ended before any of B's started (or the reverse), by the runs' own
    clock readings (time.monotonic: one machine, any process); None when they interleave or are unknown."""

    def span(runs):
        starts = [r.summary.get("start_time") for r in runs]
        ends = [r.summary.get("end_time") for r in runs]
        if any(not isinstance(t, (int, float)) for t in starts + ends):
            return None
        return min(starts), max(ends)

    sa, sb = span(a), span(b)
    if sa is None or sb is None:
        return None
    if sa[1] <= sb[0]:
        return "A", "B"
    if sb[1] <= sa[0]:
        return "B", "A"
    return None


def pair_runs(a: list[Run], b: list[Run]) -> tuple[list[tuple[Run, Run]], list[str]]:
    notes: list[str] = []
    by_a, by_b = {r.repeat: r for r in a}, {r.repeat: r for r in b}
    common = sorted(set(by_a) & set(by_b))
    if common and len(common) == max(len(a), len(b)):
        return [(by_a[i], by_b[i]) for i in common], notes
    n = min(len(a), len(b))
    if len(a) != len(b):
        notes.append(f"A has {len(a)} runs, B {len(b)}: compared the first {n} of each")
    return list(zip(a[:n], b[:n])), notes
