"""Is A better than B? Two runs, two repeated runs, or one configuration from each of two sweeps.

    python -m experiments.statistics.compare A B [--primary mean_tpot_ms] [--where scheduler.name=fcfs] [--where-a K=V]
        [--where-b K=V] [--top 5]

A side is a run folder (summary.json), a repeated run's folder (`replay.repeats=N`: its own sweep.csv) or
a sweep folder whose runs are repeats of one configuration (`--where KEY=VALUE` picks one out of a larger
sweep). Repeat i of A is paired with repeat i of B (in a seed sweep: the same seed); repeats with the same
index got the same seeds, so when their requests are the same (ids, trace arrivals, lengths) the design is
paired, else unpaired.

Per metric (mean, p50, p99 of TTFT / TPOT / E2EL over the requests completed on both sides; output and
request throughput, goodput), the difference A - B and a test of "no difference":
  paired t     >= 2 pairs on the same requests: Student t on the per-pair differences of the statistic
               (each pair is one draw of the run-to-run noise; same requests cancel the workload's share)
  Welch t      >= 2 runs per side on different workloads (e.g. redrawn per repeat but unpaired)
  bootstrap    one simulated run per side on the same requests: paired percentile bootstrap over the
               requests (the simulator has no run-to-run noise; this covers which requests were drawn).
               Simulated runs of one workload draw (a seed sweep without trace.seed) count as one pair
  no verdict   one run per side of a machine-timed executor (real engine, host executor): run-to-run
               noise is not measured, so only the observed difference is reported
Verdicts are family-wise at 5%: Holm's step-down over the tested metrics (Holm 1979; rejects whatever
Bonferroni rejects, and more). `--primary METRIC`, declared before the data are seen, is the one
confirmatory test: it alone is tested at the full 5% and the others are secondary, Holm at 5% among
themselves and claimed only when the primary is (a fixed-sequence gate: family-wise 5% over all of them;
ICH E9 sec. 2.2.2 and 5.6 on a primary variable; Westfall & Krishen 2001, J. Stat. Plan. Inference 99).
Each interval is the metric's own 95% interval. "detectable" is the difference this comparison would have
found with 80% power at the level its metric is tested at (the primary's 5%, else Holm's strictest;
noncentral t; the bootstrap's normal approximation), in % of B: "no significant difference" then reads
"nothing larger than that". Then the requests whose latency changed most, with what changed for them: queueing delay,
preemptions, prefill chunks and steps it was scheduled in (experiments.statistics.compare_requests).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd
from scipy import stats as sps

from experiments.statistics.compare_requests import LATENCY, explain, paired_requests, request_table, same_workload
from experiments.statistics.compare_sides import (
    CompareError,
    Run,
    load_side,
    one_after_the_other,
    pair_runs,
    parse_where,
)
from experiments.statistics.intervals import DEFAULT_RESAMPLES, bootstrap, detectable_effect, holm, t_test, welch_test

RUN_METRICS = ("output_throughput", "request_throughput", "request_goodput")  # per run, higher is better
STATISTICS = ("mean", "p50", "p99")
ALPHA = 0.05
POWER = 0.8
SAME = "no significant difference"
METRICS = tuple(f"{s}_{m}_ms" for m in LATENCY for s in STATISTICS) + RUN_METRICS  # the default family


@dataclass
class Comparison:
    a: str
    b: str
    pairs: int  # run pairs
    requests: int  # request pairs, over all run pairs (0 when the workloads differ)
    design: str  # paired | unpaired
    table: pd.DataFrame  # one row per metric
    changed: pd.DataFrame  # the requests whose latency changed most, and why
    notes: list[str] = field(default_factory=list)
    primary: str | None = None  # the pre-declared primary metric, tested alone at the full alpha

    def verdicts(self) -> dict[str, str]:
        return dict(zip(self.table["metric"], self.table["verdict"]))

    def text(self) -> str:
        t = self.table
        head = f"{self.pairs} run pair(s), {self.design}; {self.requests} request pairs; verdicts family-wise "
        head += f"{ALPHA:.0%}"
        if self.primary:
            secondary = int((t["tested"] & (t["role"] == "secondary")).sum())
            head += (
                f": primary {self.primary} alone at {ALPHA:.0%}; {secondary} secondary metrics Holm at {ALPHA:.0%}, "
                "claimed only when the primary is"
            )
        else:
            head += f" (Holm over {int(t['tested'].sum())} tested metrics)"
        lines = [
            f"A = {self.a}",
            f"B = {self.b}",
            head,
            "",
            f"{'metric':<20} {'A':>10} {'B':>10} {'A - B':>10} {'%':>7} {'95% interval of A - B':>23} "
            f"{'p (adj.)':>8} {'detectable':>10}  verdict",
        ]
        for r in t.itertuples():
            ci = "" if math.isnan(r.ci_low) else f"[{r.ci_low:9.2f}, {r.ci_high:9.2f}]"
            p = "" if math.isnan(r.p_adjusted) else f"{r.p_adjusted:.3g}"
            mde = "" if math.isnan(r.detectable_pct) else f"{r.detectable_pct:.1f}%"
            role = " (primary)" if r.role == "primary" else ""
            lines.append(
                f"{r.metric:<20} {r.a:10.2f} {r.b:10.2f} {r.diff:10.2f} {r.diff_pct:6.1f}% {ci:>23} {p:>8} "
                f"{mde:>10}  {r.verdict}{role}"
            )
        first = t[t["role"] == "primary"]
        if len(first) and first["verdict"].iloc[0] == SAME and first["detectable_pct"].notna().iloc[0]:
            lines += [
                "",
                f"primary {self.primary}: no significant difference; this comparison could have detected "
                f"differences larger than {first['detectable_pct'].iloc[0]:.1f}% (80% power at {ALPHA:.0%})",
            ]
        same = t[(t["verdict"] == SAME) & (t["role"] == "secondary")]
        if len(same) and same["detectable_pct"].notna().any():
            kind = "secondary metric(s)" if self.primary else "metric(s)"
            lines += [
                "",
                f"no significant difference in {len(same)} {kind}: this comparison could have detected "
                f"differences larger than {same['detectable_pct'].min():.1f}% to {same['detectable_pct'].max():.1f}% "
                f"(80% power)",
            ]
        lines.append("")
        lines += [f"{m}: {', '.join(t.loc[t['method'] == m, 'metric'])}" for m in t["method"].unique()]
        if len(self.changed):
            lines += ["", "requests whose latency changed most (A vs B):"]
            for r in self.changed.itertuples():
                change = f"{r.metric} {r.a_ms:.0f} -> {r.b_ms:.0f} ms"
                lines.append(f"  {r.request_id} (repeat {r.repeat}): {change}; {r.why}")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def to_dict(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "pairs": self.pairs,
            "requests": self.requests,
            "design": self.design,
            "primary": self.primary,
            "metrics": self.table.to_dict(orient="records"),
            "changed": self.changed.to_dict(orient="records"),
            "notes": self.notes,
        }


# ---- the statistics ---------------------------------------------------------------------------------
def check_metrics(names: list[str], option: str, valid=METRICS) -> None:
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise CompareError(f"{option} {', '.join(unknown)}: no such metric; valid: {', '.join(valid)}")


def _adjust(p: list[float], roles: list[str]) -> tuple[np.ndarray, list[float]]:
    """Adjusted p-values (reject where <= ALPHA) and the level each metric's detectable effect is computed
    at. No primary: Holm over all. A primary: its own p at ALPHA; the secondaries Holm among themselves, and
    no smaller than the primary's p (the fixed-sequence gate: a secondary is claimed only after the
    primary; an untestable primary spends nothing)."""
    p_arr = np.asarray(p, dtype=float)
    if "primary" not in roles:
        adjusted = holm(p, ALPHA)
        return adjusted, [ALPHA / max(int(np.isfinite(adjusted).sum()), 1)] * len(p)
    first = roles.index("primary")
    secondary = np.array([r == "secondary" for r in roles])
    adjusted = np.full(p_arr.shape, math.nan)
    adjusted[first] = p_arr[first]
    gate = p_arr[first] if math.isfinite(p_arr[first]) else 0.0
    adjusted[secondary] = np.maximum(holm(p_arr[secondary].tolist(), ALPHA), gate)
    family = max(int(np.isfinite(adjusted[secondary]).sum()), 1)
    return adjusted, [ALPHA if r == "primary" else ALPHA / family for r in roles]


def _stat(name: str):
    if name == "mean":
        return lambda x, axis=-1: np.mean(x, axis=axis)
    q = float(name[1:])
    return lambda x, axis=-1: np.percentile(x, q, axis=axis)


def _machine_timed(runs: list[Run]) -> bool:
    """Whether the runs' times come from this machine's clock (anything but the simulator's virtual one)."""
    return any(r.summary.get("executor", "real") != "sim" for r in runs)


def _latency_rows(pairs, paired: bool, statistics) -> list[dict]:
    tables = [(request_table(a.requests, a.steps), request_table(b.requests, b.steps)) for a, b in pairs]
    rows = []
    for metric in LATENCY:
        col = f"{metric}_ms"
        for stat in statistics:
            f = _stat(stat)
            xa, xb = [], []  # per pair: A's and B's values (paired: the requests completed on both)
            for ta, tb in tables:
                va, vb = ta[col].dropna(), tb[col].dropna()
                if paired:
                    both = va.index.intersection(vb.index)
                    va, vb = va.loc[both], vb.loc[both]
                xa.append(va.to_numpy(float))
                xb.append(vb.to_numpy(float))
            if any(len(x) == 0 for x in xa + xb):
                continue
            rows.append(
                {
                    "metric": f"{stat}_{metric}_ms",
                    "va": np.array([f(x) for x in xa]),
                    "vb": np.array([f(x) for x in xb]),
                    "samples": (xa[0], xb[0]),
                    "stat": f,
                    "higher_is_better": False,
                }
            )
    return rows


def _run_rows(pairs) -> list[dict]:
    rows: list[dict] = []
    for metric in RUN_METRICS:
        va = [p[0].summary.get(metric) for p in pairs]
        vb = [p[1].summary.get(metric) for p in pairs]
        if any(v is None for v in va + vb):
            continue
        rows.append({"metric": metric, "va": np.asarray(va, float), "vb": np.asarray(vb, float)})
        rows[-1]["higher_is_better"] = True
    return rows


class _Test(TypedDict, total=False):
    """One metric's test of A - B (_test)."""

    p: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    method: str


def _test(r: dict, paired: bool, machine: bool, n_resamples: int, seed: int) -> _Test:
    """p, standard error, df, 95% interval and method of one metric's A - B."""
    k = len(r["va"])
    diff = float(r["va"].mean() - r["vb"].mean())
    out: _Test = {"p": math.nan, "se": math.nan, "df": 0.0, "ci_low": math.nan, "ci_high": math.nan}
    if paired and k >= 2:
        out["p"], out["se"], out["df"] = t_test(r["va"] - r["vb"])
        out["method"] = "paired t over run pairs"
    elif not paired and k >= 2:
        out["p"], out["se"], out["df"] = welch_test(r["va"], r["vb"])
        out["method"] = "Welch t over runs"
    elif machine:
        return {**out, "method": "no verdict: one run per side (run-to-run noise not measured)"}
    elif not paired or "samples" not in r:
        why = "different workloads" if not paired else "a run-level figure"
        return {**out, "method": f"no verdict: one simulated run per side ({why})"}
    else:
        stat = r["stat"]
        lo, hi, dist = bootstrap(
            r["samples"],
            lambda x, y, axis=-1: stat(x, axis=axis) - stat(y, axis=axis),
            1 - ALPHA,
            n_resamples,
            seed,
            paired=True,
        )
        if dist.size == 0 or np.all(dist == dist[0]):  # no variation: identical or constant differences
            out.update({"p": 1.0 if diff == 0 else 0.0, "se": 0.0, "df": math.inf, "ci_low": lo, "ci_high": hi})
        else:
            tail = min(np.mean(dist <= 0), np.mean(dist >= 0))
            p = min(1.0, 2 * (tail * dist.size + 1) / (dist.size + 1))
            out.update({"p": p, "se": float(dist.std(ddof=1)), "df": math.inf, "ci_low": lo, "ci_high": hi})
        return {**out, "method": "paired bootstrap over requests (one simulated run per side)"}
    crit = float(sps.t.ppf(1 - ALPHA / 2, out["df"])) if out["se"] > 0 else 0.0
    out["ci_low"], out["ci_high"] = diff - crit * out["se"], diff + crit * out["se"]
    return out


def compare(
    a: str | Path,
    b: str | Path,
    where_a: dict | None = None,
    where_b: dict | None = None,
    statistics=STATISTICS,
    top: int = 5,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    metrics: list[str] | None = None,
    primary: str | None = None,
) -> Comparison:
    """metrics: the family to test (default: every latency statistic and run metric); a smaller family
    chosen before looking has more power. primary: the one metric tested alone at the full alpha, declared
    before looking (the others become secondary, gated by it: module docstring)."""
    runs_a, runs_b = load_side(a, where_a), load_side(b, where_b)
    pairs, notes = pair_runs(runs_a, runs_b)
    machine = _machine_timed(runs_a + runs_b)
    if not machine and len(pairs) > 1 and all(same_workload(pairs[0][0].requests, p[0].requests) for p in pairs):
        notes.append(
            f"the {len(pairs)} simulated runs per side ran one workload draw (a seed sweep leaves trace.seed alone): "
            "compared as one pair, over its requests; replay.repeats redraws the workload per repeat"
        )
        pairs = pairs[:1]
    paired = all(same_workload(ra.requests, rb.requests) for ra, rb in pairs)
    rows = _latency_rows(pairs, paired, statistics) + _run_rows(pairs)
    check_metrics(metrics or [], "--metric", [r["metric"] for r in rows])
    check_metrics([primary] if primary else [], "--primary", [r["metric"] for r in rows])
    if metrics:
        rows = [r for r in rows if r["metric"] in metrics or r["metric"] == primary]
    rows.sort(key=lambda r: r["metric"] != primary)  # the primary first (a stable sort keeps the rest)
    tests = [_test(r, paired, machine, n_resamples, seed) for r in rows]
    roles = ["primary" if r["metric"] == primary else "secondary" for r in rows]
    adjusted, levels = _adjust([t["p"] for t in tests], roles)
    if primary and math.isnan(tests[roles.index("primary")]["p"]):
        notes.append(f"the primary {primary} has no test here: the secondary metrics are Holm at {ALPHA:.0%} alone")
    out = []
    for r, t, p_adj, level, role in zip(rows, tests, adjusted, levels, roles):
        av, bv = float(r["va"].mean()), float(r["vb"].mean())
        diff = av - bv
        mde = detectable_effect(t["se"], t["df"], level, POWER)
        if math.isnan(p_adj):
            verdict = t["method"].split(":")[0] + (": observed difference only" if machine else "")
        elif p_adj <= ALPHA:
            verdict = "A better" if (diff > 0) == r["higher_is_better"] else "B better"
        else:
            verdict = SAME
        out.append(
            {
                "metric": r["metric"],
                "a": av,
                "b": bv,
                "diff": diff,
                "diff_pct": 100 * diff / abs(bv) if bv else math.nan,
                "ci_low": t["ci_low"],
                "ci_high": t["ci_high"],
                "se": t["se"],  # of A - B; with df, what a power calculation needs (intervals.power_at)
                "df": t["df"],
                "p": t["p"],
                "p_adjusted": p_adj,
                "detectable": mde,
                "detectable_pct": 100 * mde / abs(bv) if bv else math.nan,
                "verdict": verdict,
                "method": t["method"],
                "role": role,
                "tested": bool(np.isfinite(p_adj)),
            }
        )
    if len(pairs) == 1 and machine:
        notes.append(
            "one run per side: run-to-run (machine) noise is not measured, so there is no verdict, only the "
            "observed difference; repeat both (replay.repeats=N, N >= 5) for one"
        )
    if not paired:
        notes.append("the sides ran different requests: unpaired comparison over runs (no request pairs)")
    if machine and len(pairs) > 1 and (order := one_after_the_other(runs_a, runs_b)):
        notes.append(
            f"every run of {order[0]} ended before the first of {order[1]} started (the sides ran one after the "
            "other, not interleaved): a drift of the machine between them reads as a difference between A and "
            "B; interleave the sides (a seed sweep over both settings) so that each pair shares the machine's state"
        )
    req = paired_requests(pairs) if paired else pd.DataFrame()
    return Comparison(
        str(a),
        str(b),
        len(pairs),
        len(req),
        "paired" if paired else "unpaired",
        pd.DataFrame(out),
        explain(req, top),
        notes,
        primary,
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="run folder, repeated run's folder, or sweep folder (one configuration)")
    ap.add_argument("b")
    ap.add_argument("--where", action="append", help="KEY=VALUE filter on both sweeps' rows (repeatable)")
    ap.add_argument("--where-a", action="append", help="KEY=VALUE filter on A's rows only")
    ap.add_argument("--where-b", action="append", help="KEY=VALUE filter on B's rows only")
    ap.add_argument("--metric", action="append", help="test only these metrics (repeatable; default: all)")
    ap.add_argument(
        "--primary",
        help="the one metric tested alone at the full 5%%, declared before looking; the others are secondary "
        f"(one of {', '.join(METRICS)})",
    )
    ap.add_argument("--top", type=int, default=5, help="requests to explain (default 5)")
    ap.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES)
    ap.add_argument("--json", help="also write the comparison to this JSON file")
    args = ap.parse_args(argv)
    both = parse_where(args.where)
    try:
        result = compare(
            args.a,
            args.b,
            {**both, **parse_where(args.where_a)},
            {**both, **parse_where(args.where_b)},
            top=args.top,
            n_resamples=args.resamples,
            metrics=args.metric,
            primary=args.primary,
        )
    except CompareError as e:
        raise SystemExit(f"experiments.statistics.compare: {e}") from None
    print(result.text())
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
