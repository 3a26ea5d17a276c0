"""Repeats of one configuration -> mean and 95% confidence interval per metric, written next to sweep.csv.

    python -m experiments.aggregate results/<experiment>/<sweep dir>     # (re)writes <dir>/sweep_ci.csv

Which rows are repeats of one configuration: those with the same `config_id`, a hash of the run's
resolved config without its seeds (`seed`, `trace.seed`, the keys `replay.repeat_seeds` varies), the
repeat index and the output settings (`results`, `wandb`, `progress`). Runs made with
`replay.repeats=N` and runs of a seed sweep (`python run.py -m seed=0,1,2 ...`) group alike. Older
tables without the column are grouped by their config columns (dotted names) other than seeds.

Per configuration and numeric summary metric (sweep_ci.csv, one row each):
    n                 runs aggregated
    mean, std         over the runs (the sweep.csv values)
    ci_low, ci_high   95% confidence interval of the mean:
      method t          run-level metrics (throughputs, means, KV shares, counts): Student t over the runs
                        (run-to-run variation; none with a single run)
      method bootstrap  latency percentiles (median, pNN of ttft / tpot / e2el / itl) of a single run:
                        percentile bootstrap over its requests (ITL: over its inter-chunk gaps). It covers
                        which requests the run happened to see, treating them as independent draws.
      bootstrap + t     the same with several runs (requests resampled within each run; statistic: the
                        mean over runs of each run's percentile, the reported mean), widened to contain
                        the t interval too, since the bootstrap alone misses run-to-run variation
                        (machine load shifts every request of a run alike). `ci_t_low` / `ci_t_high`
                        always hold the t interval.
The bootstrap is seeded, so the file is reproducible; its cost is bounded (resamples_for). A Hydra
multirun rewrites the file when the sweep ends (AggregateCallback, conf/config.yaml); a run with
replay.repeats > 1 when its repeats end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

try:  # the runner extra; the rest of this module does not need Hydra
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object

from experiments.metrics import add_request_latencies, chunk_gaps, completed_mask
from experiments.results import SWEEP_TABLE, read_sweep
from experiments.stats import bootstrap_interval, percentile_of_strata, t_interval

CI_TABLE = "sweep_ci.csv"
LEVEL = 0.95
# config keys that differ between repeats of one configuration, or do not change what is measured
NOT_CONFIG = ("seed", "trace.seed", "replay.repeat", "replay.repeats", "replay.repeat_seeds")
NOT_CONFIG_TOP = ("results", "wandb", "progress")
# sweep columns that are neither configuration nor metric
INFO_COLUMNS = ("run_dir", "job_num", "overrides", "config_id", "repeat", "seed", "trace.seed", "replay.repeat")
INFO_COLUMNS += ("replay.repeats", "replay.repeat_seeds")
NOT_METRICS = ("start_time", "end_time", "num_requests", "num_sent", "job_num", "repeat", "seed")
PERCENTILE = re.compile(r"^(median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")


# ---- which runs are one configuration ---------------------------------------------------------------
def config_id(resolved: dict) -> str:
    """Short hash of a resolved config (plain dict) without seeds, repeat index and output settings."""
    cfg = json.loads(json.dumps(resolved, default=str))  # a deep copy of plain values
    varied = list(NOT_CONFIG) + list(((cfg.get("replay") or {}).get("repeat_seeds")) or [])
    for key in varied:
        node, *path = key.split(".")
        parent, name = cfg, key
        if path:
            parent = cfg.get(node)
            for part in path[:-1]:
                parent = parent.get(part) if isinstance(parent, dict) else None
            name = path[-1]
        if isinstance(parent, dict):
            parent.pop(name, None)
    for key in NOT_CONFIG_TOP:
        cfg.pop(key, None)
    return hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]


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


# ---- per-request samples for the percentile bootstrap -----------------------------------------------
def request_samples(run_dir: Path) -> dict[str, np.ndarray] | None:
    """Completed requests' ttft / tpot / e2el (ms) and the inter-chunk gaps (itl, ms) of one run."""
    path = run_dir / "requests.parquet"
    if not path.exists():
        return None
    req = pd.read_parquet(path)
    done = add_request_latencies(req[completed_mask(req)])
    out = {m: done[f"{m}_ms"].dropna().to_numpy(dtype=float) for m in ("ttft", "tpot", "e2el")}
    out["itl"] = 1e3 * np.asarray([g for t in done["token_times"] for g in chunk_gaps(t)], dtype=float)
    return out


def percentile_of(metric: str) -> tuple[str, float] | None:
    """('ttft', 99.0) for 'p99_ttft_ms', ('e2el', 50.0) for 'median_e2el_ms'; None otherwise."""
    m = PERCENTILE.match(metric)
    if not m:
        return None
    return m.group(3), 50.0 if m.group(1) == "median" else float(m.group(2))


def resamples_for(num_samples: int, n_resamples: int, budget: float = 5e7) -> int:
    """Bound the bootstrap's cost (resamples x samples): large samples (ITL gaps of long runs, hundreds of
    thousands) get fewer resamples, at least 200; their intervals are narrow, so the Monte Carlo error
    of the ends matters little."""
    return max(200, min(n_resamples, int(budget // max(num_samples, 1))))


# ---- the table --------------------------------------------------------------------------------------
def aggregate(table: pd.DataFrame, base_dir: Path | None = None, n_resamples: int = 2000) -> pd.DataFrame:
    """sweep_ci rows (module doc) for every configuration and metric of a sweep table. base_dir: the
    folder run_dir paths are relative to (for the per-request bootstrap); None: no bootstrap."""
    table = table.reset_index(drop=True)
    keys = group_key(table)
    metrics = metric_columns(table)
    cfg_cols = config_columns(table)
    rows = []
    for key, group in table.groupby(keys, sort=False):
        samples = None
        if base_dir is not None and "run_dir" in group:
            loaded = [request_samples(Path(base_dir) / str(d)) for d in group["run_dir"]]
            samples = loaded if all(s is not None for s in loaded) else None
        head = {"config_id": key, **{c: group[c].iloc[0] for c in cfg_cols}}
        for metric in metrics:
            values = group[metric].to_numpy(dtype=float)
            values = values[np.isfinite(values)]
            if values.size == 0:
                continue
            lo_t, hi_t = t_interval(values, LEVEL)
            row = {
                **head,
                "metric": metric,
                "n": int(values.size),
                "mean": float(values.mean()),
                "std": float(values.std(ddof=1)) if values.size > 1 else math.nan,
                "ci_low": lo_t,
                "ci_high": hi_t,
                "method": "t",
                "ci_t_low": lo_t,
                "ci_t_high": hi_t,
            }
            pct = percentile_of(metric)
            if pct is not None and samples is not None:
                name, q = pct
                strata = [s[name] for s in samples]
                if all(len(s) for s in strata):
                    resamples = resamples_for(sum(len(s) for s in strata), n_resamples)
                    lo, hi = bootstrap_interval(strata, percentile_of_strata(q), LEVEL, resamples, seed=0)
                    row["method"] = "bootstrap"
                    if values.size > 1:  # also cover run-to-run variation: the union with the t interval
                        lo, hi, row["method"] = min(lo, lo_t), max(hi, hi_t), "bootstrap + t"
                    row["ci_low"], row["ci_high"] = lo, hi
            rows.append(row)
    return pd.DataFrame(rows)


def write_aggregate(sweep: str | Path, n_resamples: int = 2000) -> Path | None:
    """Rewrite <dir>/sweep_ci.csv from <dir>/sweep.csv (atomic replace); None if there is no table."""
    sweep = Path(sweep)
    table_path = sweep if sweep.suffix == ".csv" else sweep / SWEEP_TABLE
    if not table_path.exists():
        return None
    out = table_path.with_name(CI_TABLE)
    agg = aggregate(read_sweep(table_path), table_path.parent, n_resamples)
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
    """Hydra callback (conf/config.yaml): when a multirun ends, write sweep_ci.csv next to its sweep.csv."""

    def on_multirun_end(self, config, **kwargs) -> None:
        table = (config.get("results") or {}).get("sweep_table") or Path(config.hydra.sweep.dir) / SWEEP_TABLE
        try:
            out = write_aggregate(table)
        except Exception as e:  # derived data: never fail a finished sweep over it
            print(f"experiments.aggregate: could not write {CI_TABLE} for {table}: {e}", file=sys.stderr)
            return
        if out is not None:
            print(f"confidence intervals: {out}", file=sys.stderr)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="a sweep folder (with sweep.csv) or the sweep.csv itself")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default 2000)")
    args = ap.parse_args(argv)
    out = write_aggregate(args.sweep, args.resamples)
    if out is None:
        raise SystemExit(f"no {SWEEP_TABLE} in {args.sweep}")
    print(out)


if __name__ == "__main__":
    main()
