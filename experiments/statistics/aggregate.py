"""Repeats of one configuration -> mean and 95% confidence interval per metric, written next to sweep.csv.

    python -m experiments.statistics.aggregate results/<experiment>/<sweep dir>     # (re)writes <dir>/sweep_ci.csv

Which rows are repeats of one configuration: those with the same `config_id` (experiments.statistics.seeds: the
resolved config without its seeds, repeat index and output settings). Runs made with `replay.repeats=N`
and runs of a seed sweep (`python run.py -m seed=0,1,2 ...`) group alike. Older tables without the column
are grouped by their config columns (dotted names) other than seeds.

Per configuration and numeric summary metric (sweep_ci.csv, one row each):
    n                 runs aggregated
    mean, std         over the runs (the sweep.csv values)
    ci_low, ci_high   95% confidence interval, by `method`:
      t               several runs: Student t over the runs (run-to-run variation: the machine's, and the
                      workload's when replay.redraw_workload). For a latency percentile it covers the
                      mean over runs of each run's percentile, the reported mean. Cut to the metric's
                      range (shares to [0, 1], times and rates to >= 0), which keeps its coverage.
      order statistic one run, latency percentile (pNN / median of ttft, tpot, e2el): the distribution-free
                      interval of the percentile from the run's requests (experiments.statistics.intervals.
                      quantile_interval), treating them as independent draws; it covers which requests
                      the run happened to see, not run-to-run variation.
      (none)          NaN ends and a `note` saying why: one run of a run-level metric; a percentile whose
                      run has too few requests for an interval at 95% ("n too small for a p99 interval");
                      one run's ITL percentiles (the gaps of one step are shared by its whole batch: not
                      independent draws).
    note              why there is no interval, or that several runs were identical (no variation
                      measured: a deterministic executor repeated on one workload draw)
A Hydra multirun rewrites the file when the sweep ends (AggregateCallback, conf/config.yaml); a run with
replay.repeats > 1 writes its own when its repeats end (experiments.run.repeats).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from hydra.experimental.callback import Callback
else:
    try:  # the runner extra; the rest of this module does not need Hydra
        from hydra.experimental.callback import Callback
    except ImportError:  # pragma: no cover
        Callback = object

from experiments.results.files import SWEEP_TABLE, read_sweep
from experiments.results.metrics import add_request_latencies, completed_mask
from experiments.statistics.intervals import quantile_interval, quantile_min_n, t_interval
from experiments.statistics.seeds import SEED_KEYS, config_id

__all__ = ["aggregate", "config_id", "group_key", "wide", "write_aggregate"]

CI_TABLE = "sweep_ci.csv"
LEVEL = 0.95
# sweep columns that are neither configuration nor metric
INFO_COLUMNS: tuple[str, ...] = ("run_dir", "job_num", "overrides", "config_id", "repeat", "redraw_workload")
INFO_COLUMNS += (*SEED_KEYS, "replay.repeat", "replay.repeats", "replay.repeat_seeds", "replay.redraw_workload")
NOT_METRICS = ("start_time", "end_time", "num_requests", "num_sent", "job_num", "repeat", "seed")
SAMPLED = ("ttft", "tpot", "e2el")  # per-request latencies: one draw per request
PERCENTILE = re.compile(r"^(median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
# metrics that are shares of a whole, in [0, 1], and those that cannot be negative (times, rates, counts)
SHARE = re.compile(r"(attainment|utilization|^frag_|hit_rate|_fraction$|acceptance_rate|_share$)")
NON_NEGATIVE = re.compile(r"(_ms$|_s$|throughput|goodput|_per_s$|tokens|^num_|_batch_size$|completed)")


# ---- which runs are one configuration ---------------------------------------------------------------
def config_columns(table: pd.DataFrame) -> list[str]:
    """The sweep columns that describe a configuration (dotted config paths), seeds excluded."""
    return [c for c in table.columns if "." in c and c not in INFO_COLUMNS]


def group_key(table: pd.DataFrame) -> pd.Series:
    """One label per configuration: config_id where recorded, else the config columns' values."""
    cols = config_columns(table)
    fallback = pd.Series(["|".join(map(str, row)) for row in table[cols].itertuples(index=False)], index=table.index)
    if "config_id" not in table:
        return fallback
    return pd.Series(
        [str(c) if isinstance(c, str) else f for c, f in zip(table["config_id"], fallback)], index=table.index
    )


def metric_columns(table: pd.DataFrame) -> list[str]:
    skip = set(INFO_COLUMNS) | set(NOT_METRICS) | set(config_columns(table))
    return [
        c
        for c in table.columns
        if c not in skip and pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(table[c])
    ]


# ---- per-request samples for one run's percentile intervals -----------------------------------------------
def request_samples(run_dir: Path) -> dict[str, np.ndarray] | None:
    """Completed requests' ttft / tpot / e2el (ms) of one run."""
    path = run_dir / "requests.parquet"
    if not path.exists():
        return None
    req = pd.read_parquet(path)
    done = add_request_latencies(req[completed_mask(req)])
    return {m: done[f"{m}_ms"].dropna().to_numpy(dtype=float) for m in SAMPLED}


def percentile_of(metric: str) -> tuple[str, float] | None:
    """('ttft', 99.0) for 'p99_ttft_ms', ('e2el', 50.0) for 'median_e2el_ms'; None otherwise."""
    m = PERCENTILE.match(metric)
    if not m:
        return None
    return m.group(3), 50.0 if m.group(1) == "median" else float(m.group(2))


# ---- the table --------------------------------------------------------------------------------------
def aggregate(table: pd.DataFrame, base_dir: Path | None = None) -> pd.DataFrame:
    """sweep_ci rows (module doc) for every configuration and metric of a sweep table. base_dir: the
    folder run_dir paths are relative to (for one run's percentile intervals); None: none of those."""
    table = table.reset_index(drop=True)
    keys = group_key(table)
    metrics = metric_columns(table)
    cfg_cols = config_columns(table)
    rows = []
    for key, group in table.groupby(keys, sort=False):
        samples = None
        if len(group) == 1 and base_dir is not None and "run_dir" in group:
            samples = request_samples(Path(base_dir) / str(group["run_dir"].iloc[0]))
        head = {"config_id": key, **{c: group[c].iloc[0] for c in cfg_cols}}
        for metric in metrics:
            values = group[metric].to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            if values.size == 0:
                continue
            row = {
                **head,
                "metric": metric,
                "n": int(values.size),
                "mean": float(values.mean()),
                "std": float(values.std(ddof=1)) if values.size > 1 else math.nan,
                **interval(metric, values, samples),
            }
            rows.append(row)
    return pd.DataFrame(rows)


def within_range(metric: str, lo: float, hi: float) -> tuple[float, float]:
    """The t interval cut to the values the metric can take (a share's [0, 1], a time's [0, inf)): the true
    value lies in the range, so it lies in the cut interval exactly when it lies in the uncut one, and the
    coverage is unchanged; a t interval of an SLO attainment near 1 otherwise reaches past 1."""
    if SHARE.search(metric):
        return max(lo, 0.0), min(hi, 1.0)
    if NON_NEGATIVE.search(metric):
        return max(lo, 0.0), hi
    return lo, hi


def interval(metric: str, values: np.ndarray, samples: dict[str, np.ndarray] | None) -> dict:
    """ci_low, ci_high, method and note of one metric of one configuration (module doc)."""
    out = {"ci_low": math.nan, "ci_high": math.nan, "method": "", "note": ""}
    if values.size > 1:
        out["ci_low"], out["ci_high"] = within_range(metric, *t_interval(values, LEVEL))
        out["method"] = "t"
        if np.all(values == values[0]):
            out["note"] = f"{values.size} identical runs: no variation measured"
        return out
    pct = percentile_of(metric)
    if pct is None:
        out["note"] = "one run: no interval (replay.repeats=N)"
        return out
    name, q = pct
    label = "median" if metric.startswith("median") else f"p{q:g}"
    if name not in SAMPLED:
        out["note"] = f"one run: no {label} {name} interval (the gaps of one step are shared by its batch)"
        return out
    if samples is None or not len(samples.get(name, ())):
        out["note"] = "one run: no interval (its requests.parquet is missing)"
        return out
    lo, hi = quantile_interval(samples[name], q, LEVEL)
    if math.isnan(lo):
        n, need = len(samples[name]), quantile_min_n(q, LEVEL)
        out["note"] = f"n too small for a {label} interval ({n} requests; {need} needed at {LEVEL:.0%})"
        return out
    out.update(ci_low=lo, ci_high=hi, method="order statistic")
    return out


def write_aggregate(sweep: str | Path) -> Path | None:
    """Rewrite <dir>/sweep_ci.csv from <dir>/sweep.csv (atomic replace); None if there is no table."""
    sweep = Path(sweep)
    table_path = sweep if sweep.suffix == ".csv" else sweep / SWEEP_TABLE
    if not table_path.exists():
        return None
    out = table_path.with_name(CI_TABLE)
    agg = aggregate(read_sweep(table_path), table_path.parent)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    agg.to_csv(tmp, index=False)
    os.replace(tmp, out)
    return out


def wide(agg: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per configuration: its config columns, <metric>, <metric>_ci_low, <metric>_ci_high and n
    (the most runs any metric had), for plots and tables."""
    agg = agg[agg["metric"].isin(metrics)]
    values = agg.pivot(index="config_id", columns="metric", values=["mean", "ci_low", "ci_high"])
    values.columns = [m if stat == "mean" else f"{m}_{stat}" for stat, m in values.columns]
    values["n"] = agg.groupby("config_id")["n"].max()
    head = agg.drop_duplicates("config_id")[[c for c in agg.columns if c == "config_id" or "." in c]]
    return head.merge(values.reset_index(), on="config_id")


class AggregateCallback(Callback):
    """Hydra callback (conf/config.yaml): when a multirun ends, write sweep_ci.csv next to its sweep.csv.
    While it runs, SIGTERM / SIGHUP stop its job processes first (experiments.run.sweep_signals)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from experiments.run.sweep_signals import install

        install(on_stopped=lambda: self.on_multirun_end(config))

    def on_multirun_end(self, config, **kwargs) -> None:
        table = (config.get("results") or {}).get("sweep_table") or Path(config.hydra.sweep.dir) / SWEEP_TABLE
        try:
            out = write_aggregate(table)
        except Exception as e:  # derived data: never fail a finished sweep over it
            print(f"experiments.statistics.aggregate: could not write {CI_TABLE} for {table}: {e}", file=sys.stderr)
            return
        if out is not None:
            print(f"confidence intervals: {out}", file=sys.stderr)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="a sweep folder (with sweep.csv) or the sweep.csv itself")
    args = ap.parse_args(argv)
    out = write_aggregate(args.sweep)
    if out is None:
        raise SystemExit(f"no {SWEEP_TABLE} in {args.sweep}")
    print(out)


if __name__ == "__main__":
    main()
