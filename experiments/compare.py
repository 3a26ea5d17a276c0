"""Paired comparison of two runs (or two sweeps of repeats) on the same trace: is A better than B?

    python -m experiments.compare RUN_OR_SWEEP_A RUN_OR_SWEEP_B [--where scheduler.name=fcfs] [--top 5]

A side is a run folder (summary.json) or a sweep folder (sweep.csv) whose runs are repeats of one
configuration (`--where KEY=VALUE` picks one out of a larger sweep). Repeat i of A is paired with
repeat i of B, and within a pair request r with request r (the same request ids: the same trace).

Per-request latencies (TTFT, TPOT, E2EL; completed in both): for the mean and each percentile, the
difference A - B with a paired percentile-bootstrap interval (request pairs resampled together). That
interval covers which requests were sampled, not run-to-run variation (machine load shifts every
request of a run alike): with >= 2 repeat pairs it is widened to also contain the paired t interval of
the per-pair differences; with one run per side the output says so. Run-level metrics (throughputs,
goodput): the paired t interval of the per-repeat differences (needs >= 2 repeats each). The verdict:
"A better" / "B better" when the interval excludes 0, otherwise "no significant difference". The
intervals are family-wise: each at 1 - 0.05/k for k comparisons (Bonferroni), so that all verdicts
together are wrong with probability <= 5%.

Then the requests whose latency changed most, with what changed for them: queueing delay (arrival to
first scheduling), preemptions, prefill chunks (steps that prefilled it, recomputation included: from
steps.parquet's prefill_ids) and steps it was scheduled in.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.aggregate import group_key
from experiments.metrics import add_request_latencies, completed_mask
from experiments.results import SWEEP_TABLE, load_run, read_sweep
from experiments.stats import DEFAULT_RESAMPLES, bootstrap_interval, t_interval

LATENCY = ("ttft", "tpot", "e2el")  # per request, lower is better
RUN_METRICS = ("output_throughput", "request_throughput", "request_goodput")  # per run, higher is better
STATISTICS = ("mean", "p50", "p99")
ALPHA = 0.05


class CompareError(ValueError):
    pass


@dataclass
class Run:
    path: Path
    repeat: int  # the replicate: repeat index, or seed in a seed sweep
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame


@dataclass
class Comparison:
    a: str
    b: str
    pairs: int  # repeat pairs
    requests: int  # request pairs, over all repeat pairs
    table: pd.DataFrame  # one row per metric and statistic
    changed: pd.DataFrame  # the requests whose latency changed most, and why
    notes: list[str] = field(default_factory=list)

    def verdicts(self) -> dict[str, str]:
        return dict(zip(self.table["metric"], self.table["verdict"]))

    def text(self) -> str:
        t = self.table
        lines = [
            f"A = {self.a}",
            f"B = {self.b}",
            f"{self.pairs} repeat pair(s), {self.requests} request pairs; intervals family-wise "
            f"{1 - ALPHA:.0%} (Bonferroni over {int(t['tested'].sum())} comparisons)",
            "",
            f"{'metric':<24} {'A':>11} {'B':>11} {'A - B':>11} {'interval of A - B':>25}  verdict",
        ]
        for r in t.itertuples():
            ci = "" if math.isnan(r.ci_low) else f"[{r.ci_low:10.2f}, {r.ci_high:10.2f}]"
            lines.append(f"{r.metric:<24} {r.a:11.2f} {r.b:11.2f} {r.diff:11.2f} {ci:>25}  {r.verdict}")
        lines.append("")
        lines += [f"{m}: {', '.join(t.loc[t['method'] == m, 'metric'])}" for m in t["method"].unique()]
        if len(self.changed):
            lines += ["", "requests whose latency changed most (A vs B):"]
            for r in self.changed.itertuples():
                change = f"{r.metric} {r.a_ms:.0f} -> {r.b_ms:.0f} ms"
                lines.append(f"  {r.request_id} (repeat {r.repeat}): {change}; {r.why}")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


# ---- loading ----------------------------------------------------------------------------------------
def _parse_where(where: list[str] | None) -> dict[str, str]:
    out = {}
    for item in where or []:
        if "=" not in item:
            raise CompareError(f"--where expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = value
    return out


def load_side(path: str | Path, where: dict[str, str] | None = None) -> list[Run]:
    """The runs of one side: a run folder, or the runs of one configuration in a sweep folder."""
    path = Path(path)
    if (path / "summary.json").exists():
        summary, requests, steps = load_run(path)
        return [Run(path, int(summary.get("repeat") or 0), summary, requests, steps)]
    if not (path / SWEEP_TABLE).exists():
        raise CompareError(f"{path}: neither a run folder (summary.json) nor a sweep folder ({SWEEP_TABLE})")
    table = read_sweep(path)
    for key, value in (where or {}).items():
        if key not in table:
            raise CompareError(f"--where {key}: no such column in {path / SWEEP_TABLE}")
        table = table[table[key].astype(str) == value]
    if table.empty:
        raise CompareError(f"{path}: no runs match {where}")
    keys = group_key(table)
    if keys.nunique() > 1:
        varying = [c for c in table.columns if "." in c and table[c].astype(str).nunique() > 1]
        raise CompareError(
            f"{path} holds {keys.nunique()} configurations (differing in {varying}); pick one with --where KEY=VALUE"
        )
    # which replicate a run is: its repeat index, or its seed in a seed sweep (where every repeat index
    # is 0), or its position
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


def pair_runs(a: list[Run], b: list[Run]) -> tuple[list[tuple[Run, Run]], list[str]]:
    notes = []
    by_a, by_b = {r.repeat: r for r in a}, {r.repeat: r for r in b}
    common = sorted(set(by_a) & set(by_b))
    if common and len(common) == max(len(a), len(b)):
        return [(by_a[i], by_b[i]) for i in common], notes
    n = min(len(a), len(b))
    if len(a) != len(b):
        notes.append(f"A has {len(a)} runs, B {len(b)}: compared the first {n} of each")
    return list(zip(a[:n], b[:n])), notes


# ---- per-request table ------------------------------------------------------------------------------
def _prefill_chunks(steps: pd.DataFrame) -> pd.Series:
    if "prefill_ids" not in steps or steps.empty:
        return pd.Series(dtype=float)
    return steps["prefill_ids"].explode().dropna().value_counts()


def _scheduled_steps(steps: pd.DataFrame) -> pd.Series:
    if "scheduled_ids" not in steps or steps.empty:
        return pd.Series(dtype=float)
    return steps["scheduled_ids"].explode().dropna().value_counts()


def request_table(run: Run) -> pd.DataFrame:
    """Completed requests with latencies (ms) and what happened to them."""
    req = add_request_latencies(run.requests[completed_mask(run.requests)])
    req = req.set_index("request_id")
    out = req[[f"{m}_ms" for m in LATENCY] + ["num_preemptions"]].copy()
    out["queue_ms"] = 1e3 * (req["first_scheduled_time"] - req["arrival_time"])
    out["prefill_chunks"] = _prefill_chunks(run.steps).reindex(out.index)
    out["scheduled_steps"] = _scheduled_steps(run.steps).reindex(out.index)
    return out


def paired_requests(pairs: list[tuple[Run, Run]]) -> pd.DataFrame:
    frames = []
    for pair, (ra, rb) in enumerate(pairs):
        ta, tb = request_table(ra), request_table(rb)
        joined = ta.merge(tb, how="inner", left_index=True, right_index=True, suffixes=("_a", "_b"))
        if joined.empty:
            raise CompareError(
                f"{ra.path} and {rb.path} share no completed request ids: a paired comparison needs the same trace"
            )
        joined.insert(0, "pair", pair)
        joined.insert(1, "repeat", ra.repeat)
        frames.append(joined.reset_index())
    return pd.concat(frames, ignore_index=True)


# ---- the comparison ---------------------------------------------------------------------------------
def _stat(name: str):
    if name == "mean":
        return lambda x, axis=-1: np.mean(x, axis=axis)
    q = float(name[1:])
    return lambda x, axis=-1: np.percentile(x, q, axis=axis)


def _verdict(lo: float, hi: float, higher_is_better: bool) -> str:
    if math.isnan(lo):
        return "not tested (one run each: use replay.repeats=N)"
    if lo > 0 or hi < 0:
        a_larger = lo > 0
        return "A better" if a_larger == higher_is_better else "B better"
    return "no significant difference"


def compare(
    a: str | Path,
    b: str | Path,
    where_a: dict | None = None,
    where_b: dict | None = None,
    statistics=STATISTICS,
    top: int = 5,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    runs_a, runs_b = load_side(a, where_a), load_side(b, where_b)
    pairs, notes = pair_runs(runs_a, runs_b)
    req = paired_requests(pairs)
    rows = []
    for metric in LATENCY:
        for stat in statistics:
            both = req[["pair", f"{metric}_ms_a", f"{metric}_ms_b"]].dropna()
            f = _stat(stat)
            xa, xb = both.iloc[:, 1].to_numpy(float), both.iloc[:, 2].to_numpy(float)
            per_pair = [
                f(g.iloc[:, 1].to_numpy(float)) - f(g.iloc[:, 2].to_numpy(float)) for _, g in both.groupby("pair")
            ]
            rows.append(
                {
                    "metric": f"{stat}_{metric}_ms",
                    "a": float(f(xa)) if len(xa) else math.nan,
                    "b": float(f(xb)) if len(xb) else math.nan,
                    "samples": (xa, xb),
                    "diffs": np.asarray(per_pair, float),
                    "stat": f,
                    "higher_is_better": False,
                }
            )
    for metric in RUN_METRICS:
        va = [p[0].summary.get(metric) for p in pairs]
        vb = [p[1].summary.get(metric) for p in pairs]
        if any(v is None for v in va + vb):
            continue
        rows.append(
            {
                "metric": metric,
                "a": float(np.mean(va)),
                "b": float(np.mean(vb)),
                "diffs": np.asarray(va, float) - np.asarray(vb, float),
                "higher_is_better": True,
            }
        )
    tested = [("samples" in r and len(r["samples"][0]) > 0) or len(r["diffs"]) >= 2 for r in rows]
    level = 1 - ALPHA / max(1, sum(tested))
    out = []
    for r, is_tested in zip(rows, tested):
        lo, hi, method = math.nan, math.nan, "not tested"
        if is_tested and "samples" in r:
            stat = r["stat"]
            lo, hi = bootstrap_interval(
                r["samples"],
                lambda x, y, axis=-1, stat=stat: stat(x, axis=axis) - stat(y, axis=axis),
                level,
                n_resamples,
                seed,
                paired=True,
            )
            method = "paired bootstrap over requests"
            if len(r["diffs"]) >= 2:  # widen to cover run-to-run variation too
                t_lo, t_hi = t_interval(r["diffs"], level)
                lo, hi, method = min(lo, t_lo), max(hi, t_hi), method + " + paired t over repeats"
        elif is_tested:
            lo, hi = t_interval(r["diffs"], level)
            method = "paired t over repeats"
        out.append(
            {
                "metric": r["metric"],
                "a": r["a"],
                "b": r["b"],
                "diff": r["a"] - r["b"],
                "ci_low": lo,
                "ci_high": hi,
                "verdict": _verdict(lo, hi, r["higher_is_better"]),
                "method": method,
                "tested": is_tested,
            }
        )
    if len(pairs) == 1:
        notes.append(
            "one run per side: the latency intervals cover request sampling only, not run-to-run variation "
            "(machine load); repeat both (replay.repeats=N) before reading a difference as the configuration's"
        )
    table = pd.DataFrame(out)
    changed = explain(req, top)
    return Comparison(str(a), str(b), len(pairs), len(req), table, changed, notes)


def explain(req: pd.DataFrame, top: int, metric: str = "e2el") -> pd.DataFrame:
    """The `top` request pairs whose `metric` changed most, with the differences that explain it."""
    if top <= 0 or req.empty:
        return pd.DataFrame()
    delta = (req[f"{metric}_ms_b"] - req[f"{metric}_ms_a"]).abs()
    rows = []
    for i in delta.nlargest(top).index:
        r = req.loc[i]
        reasons = []
        dq = r["queue_ms_b"] - r["queue_ms_a"]
        if abs(dq) >= 1:
            reasons.append(f"queueing {r['queue_ms_a']:.0f} -> {r['queue_ms_b']:.0f} ms")
        if r["num_preemptions_a"] != r["num_preemptions_b"]:
            reasons.append(f"preemptions {int(r['num_preemptions_a'])} -> {int(r['num_preemptions_b'])}")
        for col, what in (("prefill_chunks", "prefill chunks"), ("scheduled_steps", "steps scheduled")):
            ca, cb = r.get(f"{col}_a"), r.get(f"{col}_b")
            if pd.notna(ca) and pd.notna(cb) and ca != cb:
                reasons.append(f"{what} {int(ca)} -> {int(cb)}")
        rows.append(
            {
                "request_id": r["request_id"],
                "repeat": int(r["repeat"]),
                "metric": metric,
                "a_ms": r[f"{metric}_ms_a"],
                "b_ms": r[f"{metric}_ms_b"],
                "queue_ms_a": r["queue_ms_a"],
                "queue_ms_b": r["queue_ms_b"],
                "preemptions_a": r["num_preemptions_a"],
                "preemptions_b": r["num_preemptions_b"],
                "prefill_chunks_a": r.get("prefill_chunks_a"),
                "prefill_chunks_b": r.get("prefill_chunks_b"),
                "why": "; ".join(reasons) or "same queueing, preemptions and chunks: slower steps",
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="run folder or sweep folder (repeats of one configuration)")
    ap.add_argument("b")
    ap.add_argument("--where", action="append", help="KEY=VALUE filter on both sweeps' rows (repeatable)")
    ap.add_argument("--where-a", action="append", help="KEY=VALUE filter on A's rows only")
    ap.add_argument("--where-b", action="append", help="KEY=VALUE filter on B's rows only")
    ap.add_argument("--top", type=int, default=5, help="requests to explain (default 5)")
    ap.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES)
    ap.add_argument("--json", help="also write the comparison to this JSON file")
    args = ap.parse_args(argv)
    both = _parse_where(args.where)
    try:
        result = compare(
            args.a,
            args.b,
            {**both, **_parse_where(args.where_a)},
            {**both, **_parse_where(args.where_b)},
            top=args.top,
            n_resamples=args.resamples,
        )
    except CompareError as e:
        raise SystemExit(f"experiments.compare: {e}") from None
    print(result.text())
    if args.json:
        data = {
            "a": result.a,
            "b": result.b,
            "pairs": result.pairs,
            "requests": result.requests,
            "metrics": result.table.to_dict(orient="records"),
            "changed": result.changed.to_dict(orient="records"),
            "notes": result.notes,
        }
        Path(args.json).write_text(json.dumps(data, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
