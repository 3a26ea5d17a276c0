"""The fidelity study's tables: each real figure's mean and 95% interval over its repeats, the simulated
figure's error against that mean and whether it lies inside the interval, the capacity knee, and step-time
residuals by step kind.

Intervals are Student t intervals of the mean over the real repeats (experiments.statistics.intervals.t_interval); with
three repeats they are wide, which is the point: a simulator cannot be judged closer to the real engine
than the real engine is to itself. The knee is the highest offered rate whose SLO attainment is at least
`attainment` (default 0.9), linearly interpolated between the last open-loop load that meets it and the
first that does not; when every load meets it the highest load is a lower bound (flagged), when none does
the knee is below the sweep (NaN).
"""

import math

import numpy as np
import pandas as pd

from experiments.statistics.aggregate import within_range
from experiments.statistics.intervals import t_interval

METRICS = (
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "request_goodput",
    "slo_attainment",
)
# the targets: |error| on median and p99 TPOT and E2EL <= 5%, TTFT <= 10%, the knee <= 5%
TARGETS = {f"{s}_{m}_ms": t for m, t in (("tpot", 0.05), ("e2el", 0.05), ("ttft", 0.10)) for s in ("median", "p99")}
KNEE_TARGET = 0.05


def step_kind(prefill_seqs: int, decode_seqs: int) -> str:
    if prefill_seqs == 0:
        return "decode"
    return "prefill" if decode_seqs == 0 else "mixed"


def figures(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (cell, cost model, metric): real mean, interval, n, simulated value, error, inside."""
    rows = []
    real = runs[runs["side"] == "real"]
    for cell, group in real.groupby("cell", sort=False):
        sims = runs[(runs["side"] == "sim") & (runs["cell"] == cell)]
        drift = probe_drifts(group)
        for metric in METRICS:
            values = group[metric].to_numpy(dtype=float)
            mean = float(np.nanmean(values)) if np.isfinite(values).any() else math.nan
            lo, hi = within_range(metric, *t_interval(values))
            for sim in sims.itertuples():
                value = float(getattr(sim, metric))
                err = (value - mean) / mean if mean else math.nan
                target = TARGETS.get(metric)
                rows.append(
                    {
                        "cell": cell,
                        "cost_model": sim.cost_model,
                        "metric": metric,
                        "real_mean": mean,
                        "real_ci_low": lo,
                        "real_ci_high": hi,
                        "real_n": int(np.isfinite(values).sum()),
                        "real_ci_rel_halfwidth": (hi - lo) / 2 / mean if mean else math.nan,
                        "sim": value,
                        "rel_error": err,
                        "inside_real_ci": bool(lo <= value <= hi) if math.isfinite(lo) else False,
                        "target": target,
                        "meets_target": bool(abs(err) <= target) if target is not None else None,
                        # the real repeats' own spread is wider than the target: the target cannot be judged
                        "spread_exceeds_target": bool((hi - lo) / 2 / mean > target) if target and mean else None,
                        **drift,
                    }
                )
    return pd.DataFrame(rows, columns=list(rows[0]) if rows else ["cell", "cost_model", "metric"])


def probe_drifts(real: pd.DataFrame) -> dict:
    """A cell's probe drift against the calibration's start probe, each the mean over its real repeats: timed
    before the runs, after them (NaN where none was timed), of the run probe (the mean of the two; the probe
    before alone where none was timed after: what drift matching uses), and the largest |drift| of any probe."""

    def mean(column: str) -> float:
        values = real[column].to_numpy(dtype=float) if column in real else np.array([])
        return float(np.mean(values[np.isfinite(values)])) if np.isfinite(values).any() else math.nan

    every = np.concatenate([real[c].to_numpy(dtype=float) for c in ("drift", "drift_after") if c in real])
    every = every[np.isfinite(every)]
    return {
        "probe_drift_before": mean("drift"),
        "probe_drift_after": mean("drift_after"),
        "probe_drift_mean": mean("drift_mean" if "drift_mean" in real else "drift"),
        "probe_drift_max": float(np.max(np.abs(every))) if len(every) else math.nan,
    }


def knee(rates, attainments, attainment: float = 0.9) -> tuple[float, bool]:
    """(knee rate, is_lower_bound) from an open-loop sweep."""
    pts = sorted(zip(rates, attainments))
    if not pts or pts[0][1] < attainment:
        return math.nan, False
    for (r0, a0), (r1, a1) in zip(pts, pts[1:]):
        if a1 < attainment:
            return r0 + (r1 - r0) * (a0 - attainment) / (a0 - a1), False
    return pts[-1][0], True


def knees(runs: pd.DataFrame, attainment: float = 0.9) -> pd.DataFrame:
    """Per trace: the real knee per repeat (its mean and interval) and each cost model's knee."""
    rows = []
    open_runs = runs[runs["mode"] == "open"]
    for trace, group in open_runs.groupby("trace", sort=False):
        real = group[group["side"] == "real"]
        per_repeat, real_bound = [], False
        for _, g in real.groupby("repeat"):
            value, bound = knee(g["offered_rate"], g["slo_attainment"], attainment)
            per_repeat.append(value)
            real_bound |= bound
        mean = float(np.nanmean(per_repeat)) if np.isfinite(per_repeat).any() else math.nan
        lo, hi = t_interval(per_repeat)
        for cost_model, sim in group[group["side"] == "sim"].groupby("cost_model"):
            value, lower_bound = knee(sim["offered_rate"], sim["slo_attainment"], attainment)
            err = (value - mean) / mean if mean else math.nan
            rows.append(
                {
                    "trace": trace,
                    "cost_model": cost_model,
                    "attainment": attainment,
                    "real_knee_mean": mean,
                    "real_ci_low": lo,
                    "real_ci_high": hi,
                    "real_knees": per_repeat,
                    "real_knee_is_lower_bound": real_bound,
                    "sim_knee": value,
                    "sim_knee_is_lower_bound": lower_bound,
                    "rel_error": err,
                    "inside_real_ci": bool(lo <= value <= hi) if math.isfinite(lo) else False,
                    # a knee at the grid's top is a lower bound: its error too, so it cannot be said to meet
                    "meets_target": bool(abs(err) <= KNEE_TARGET and not (lower_bound or real_bound))
                    if math.isfinite(err)
                    else False,
                }
            )
    return pd.DataFrame(rows)


def residuals_by_kind(steps: pd.DataFrame) -> pd.DataFrame:
    """Per cost model and step kind: (predicted - measured) / measured over every busy real step."""
    rows = []
    for (cost_model, kind), g in steps.groupby(["cost_model", "kind"]):
        err = (g["predicted_s"] - g["measured_s"]) / g["measured_s"]
        rows.append(
            {
                "cost_model": cost_model,
                "kind": kind,
                "steps": len(g),
                "median_rel_error": float(err.median()),
                "median_abs_rel_error": float(err.abs().median()),
                "p90_abs_rel_error": float(err.abs().quantile(0.9)),
                "measured_median_ms": 1e3 * float(g["measured_s"].median()),
            }
        )
    return pd.DataFrame(rows)


def residuals_by_repeat(steps: pd.DataFrame) -> pd.DataFrame:
    """Per cost model, step kind and real repeat: the median residual, its steps and the repeats' mean probe
    drift. A run's place in the study's order can move the real engine's speed; this shows whether it did."""
    rows = []
    for (cost_model, kind, repeat), g in steps.groupby(["cost_model", "kind", "repeat"]):
        err = (g["predicted_s"] - g["measured_s"]) / g["measured_s"]
        rows.append(
            {
                "cost_model": cost_model,
                "kind": kind,
                "repeat": int(repeat),
                "steps": len(g),
                "median_rel_error": float(err.median()),
                "mean_probe_drift": _cell_mean(g, "drift"),
                "mean_probe_drift_after": _cell_mean(g, "drift_after"),
            }
        )
    return pd.DataFrame(rows)


def _cell_mean(steps: pd.DataFrame, column: str) -> float:
    """The mean of a per-run column over the runs these steps came from (one repeat: one run per cell)."""
    return float(steps.drop_duplicates("cell")[column].mean()) if column in steps else math.nan


def calibration_line(profile: dict) -> str:
    """The profile's date, fit and self-check in one line (the report names the calibration it rests on)."""
    fit, check = profile.get("fit") or {}, profile.get("self_check") or {}
    probes = ", ".join(f"{1e3 * p:.0f}" for p in check.get("probe_seconds") or [])
    verdict = "passed" if check.get("passed") else f"FAILED ({'; '.join(check.get('failures') or [])})"
    forced = ", written with --force" if check.get("forced") else ""
    date = profile.get("date") or (profile.get("environment") or {}).get("date", "n/a")
    return (
        f"profile dated {date}; whole-step fit over {fit.get('samples', 'n/a')} steps, "
        f"median |error| {_share(fit.get('median_abs_rel_err'))}, "
        f"p90 {_share(fit.get('p90_abs_rel_err'))}, R^2 {fit.get('r2', math.nan):.3f}; probe start / middle / end "
        f"{probes or 'n/a'} ms, drift {_share(check.get('drift'))}; self-check {verdict if check else 'n/a'}{forced}"
    )


def _share(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _pct(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.1f}%"


def summary_markdown(
    figs: pd.DataFrame,
    knee_table: pd.DataFrame,
    residuals: pd.DataFrame,
    header: str,
    by_repeat: pd.DataFrame | None = None,
) -> str:
    from experiments.results.environment import markdown_table

    lines = [header, ""]
    if not len(figs):  # --sims-last: real runs written before any simulation
        lines += ["No cell simulated yet: every run so far is in runs.csv.", ""]
    shown = [m for m in METRICS if m in TARGETS or m in ("request_throughput", "request_goodput")]
    for cost_model, g in figs.groupby("cost_model", sort=False):
        lines += [
            f"### executor.cost_model={cost_model} (SIMULATED) vs real: error against the real mean "
            "(`in` = inside the real 95% interval; `*` = the real interval's half-width exceeds the target)",
            "",
        ]
        body = []
        for cell, c in g.groupby("cell", sort=False):
            by = c.set_index("metric")
            cells = []
            for m in shown:
                r = by.loc[m]
                mark = " in" if r["inside_real_ci"] else ""
                mark += "*" if r["spread_exceeds_target"] else ""
                cells.append(_pct(r["rel_error"]) + mark)
            drift = " / ".join(_pct(by[f"probe_drift_{k}"].iloc[0]) for k in ("before", "after", "mean"))
            body.append([cell, *cells, drift])
        lines += [markdown_table(["cell", *shown, "probe drift before / after / mean"], body), ""]
    real = figs.drop_duplicates(["cell", "metric"])
    lines += ["### Real figures: mean [95% interval] over repeats", ""] if len(real) else []
    body = []
    for cell, c in real.groupby("cell", sort=False):
        by = c.set_index("metric")
        body.append(
            [cell, int(by["real_n"].iloc[0])]
            + [
                f"{by.loc[m, 'real_mean']:.4g} [{by.loc[m, 'real_ci_low']:.4g}, {by.loc[m, 'real_ci_high']:.4g}]"
                for m in shown
            ]
        )
    lines += [markdown_table(["cell", "n", *shown], body), ""] if body else []
    if len(knee_table):
        lines += ["### Capacity knee (highest rate meeting the SLO for the attainment shown), req/s", ""]
        lines += [
            markdown_table(
                ["trace", "cost model", "real mean [95% CI]", "sim", "error", "inside"],
                [
                    [
                        r.trace,
                        r.cost_model,
                        f"{'>= ' if r.real_knee_is_lower_bound else ''}{r.real_knee_mean:.3g} "
                        f"[{r.real_ci_low:.3g}, {r.real_ci_high:.3g}]",
                        f"{'>= ' if r.sim_knee_is_lower_bound else ''}{r.sim_knee:.3g}",
                        _pct(r.rel_error),
                        "yes" if r.inside_real_ci else "no",
                    ]
                    for r in knee_table.itertuples()
                ],
            ),
            "",
        ]
    if len(residuals):
        lines += ["### Step-time residuals (predicted - measured) / measured, busy real steps", ""]
        lines += [
            markdown_table(
                ["cost model", "kind", "steps", "median", "median |.|", "p90 |.|", "measured median (ms)"],
                [
                    [
                        r.cost_model,
                        r.kind,
                        r.steps,
                        _pct(r.median_rel_error),
                        f"{100 * r.median_abs_rel_error:.1f}%",
                        f"{100 * r.p90_abs_rel_error:.1f}%",
                        f"{r.measured_median_ms:.2f}",
                    ]
                    for r in residuals.itertuples()
                ],
            ),
            "",
        ]
    if by_repeat is not None and len(by_repeat):
        lines += [
            "### Step-time residuals per real repeat: median (steps), mean probe drift of its runs before / after",
            "",
        ]
        repeats = sorted(by_repeat["repeat"].unique())
        body = []
        for (cost_model, kind), g in by_repeat.groupby(["cost_model", "kind"]):
            by = g.set_index("repeat")
            body.append(
                [cost_model, kind]
                + [
                    f"{_pct(by.loc[k, 'median_rel_error'])} ({by.loc[k, 'steps']}), drift "
                    f"{_pct(by.loc[k, 'mean_probe_drift'])} / {_pct(by.loc[k, 'mean_probe_drift_after'])}"
                    if k in by.index
                    else "n/a"
                    for k in repeats
                ]
            )
        lines += [markdown_table(["cost model", "kind", *[f"repeat {k}" for k in repeats]], body), ""]
    return "\n".join(lines) + "\n"
