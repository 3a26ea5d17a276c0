"""Drift-matched fidelity: the simulator judged at the machine speed each real run measured.

On a shared machine the real engine's speed moves by 10-15% within minutes, so a simulated figure priced at
the calibration's speed differs from a real run's by model error plus drift. Each real run is bracketed by
the probe (experiments/calibration/probe.py, timed on its engine just before and just after it), which says
how fast the machine was; the drift-matched simulation of that run prices every step at cost_scale =
run probe / reference. The reference is the MEAN of the calibration's start, middle and end probes: the
profile is fitted to samples taken across the whole calibration, so it describes the machine's average speed
over it, not its speed at the start. The run probe is the MEAN of the probes before and after the run
(`run_probe`; the probe before alone where no probe after was timed, as in studies before it existed): the
run's steps lie between the two, so if the speed moves steadily between them the run's mean step time moves
with their mean, and averaging two ~1 s probes halves the variance of the probe's own noise, which flattens
the probe's slope against the runs' speed (regression dilution). The matching on the probe before alone is
kept beside it (`sim_matched_before`, columns `*_before`) to compare the two choices.

Tables (pure functions of the study's runs.csv and step_residuals.csv rows):
  drift_matched   per cell, cost model and metric: the real mean and 95% interval, the raw simulated figure
                  (scale 1) and the drift-matched one (the mean of the per-run matched simulations), each
                  with its error against the real mean and whether it lies inside the interval, the same for
                  the matching on the probe before alone, the real interval's half-width against the issue's
                  target, and a verdict
  knee_matched    the capacity knee of the matched simulations, per real repeat, against the real knee
(the probe gauge tables, how well a probe predicts a run's step speed: experiments/studies/probe_gauge.py)
The re-analysis also simulates each run at the step speed the run itself measured (`sim_step_matched`:
cost_scale = 1 / (1 + the run's median step residual)): an oracle, not a prediction, that tells a miss the
probe failed to gauge (the speed level) from one the cost model's shape or the queue makes.
Verdicts, for the figures with a target: `met` (raw error within it), `drift` (missed raw, met once
matched: the measured cause is the machine's speed), `speed` (met only at the run's own measured step speed:
the machine's speed during the run, which the probe did not gauge), `spread` (missed, but the real
interval's half-width exceeds the target and the matched figure lies inside it: three repeats cannot judge
the target), `unexplained`.
"""

import math

import numpy as np
import pandas as pd

from experiments.statistics.aggregate import within_range
from experiments.statistics.intervals import t_interval
from experiments.studies.fidelity_report import KNEE_TARGET, METRICS, TARGETS, knee

MATCHED = "sim_matched"  # runs.csv side of a drift-matched simulation (its repeat: the real run it matches)
MATCHED_BEFORE = "sim_matched_before"  # the same, matched to the probe before the run alone
STEP_MATCHED = "sim_step_matched"  # at the run's own median step speed (the oracle)
VERDICTS = {
    "met": "raw error within the target",
    "drift": "missed raw, met drift-matched: the machine's measured speed explains it",
    "speed": "met only at the run's own measured step speed: a speed change the probe did not gauge",
    "spread": "missed both ways; the real interval is wider than the target and holds the matched figure",
    "unexplained": "missed, not explained by the probe's drift or the real spread",
}
# a knee verdict only: no real run met the attainment at any load of the grid, so the knee lies below it
NO_KNEE = "no knee in the load grid"
# a knee verdict only: some run met the attainment at the grid's highest load, so that knee is only a lower
# bound and so is its error: not judged (a knee "within 5%" of a bound could be any distance past it)
PAST_GRID = "a knee at or past the top of the load grid: its error is a bound"


def reference_probe(profile: dict) -> float | None:
    """The calibration's speed the profile describes: mean of its start, middle and end probes (s)."""
    probes = (profile.get("self_check") or {}).get("probe_seconds") or []
    return float(np.mean(probes)) if probes else None


def run_probe(before: float, after: float | None) -> float:
    """The probe time a run's matched simulation uses: the mean of the probes before and after it, or the
    probe before alone where none was timed after (the module's docstring says why)."""
    return (before + after) / 2 if after is not None and math.isfinite(after) else before


def cost_scales(runs: pd.DataFrame, reference: float) -> pd.DataFrame:
    """The real runs with the cost_scale their matched simulations run at: `cost_scale` (run_probe /
    reference), `cost_scale_before` (the probe before / reference) and `cost_scale_after` (NaN if none)."""
    real = runs[runs["side"] == "real"].copy()
    real["repeat"] = real["repeat"].astype(int)
    after = real["probe_after_s"].astype(float) if "probe_after_s" in real else pd.Series(math.nan, index=real.index)
    real["probe_after_s"] = after
    real["cost_scale"] = [run_probe(b, a) / reference for b, a in zip(real["probe_s"], after)]
    real["cost_scale_before"] = real["probe_s"] / reference
    real["cost_scale_after"] = after / reference
    return real


def _error(value: float, mean: float) -> float:
    return (value - mean) / mean if mean and math.isfinite(mean) else math.nan


def _inside(value: float, lo: float, hi: float) -> bool:
    return bool(lo <= value <= hi) if math.isfinite(lo) and math.isfinite(value) else False


def verdict(
    raw: float, matched: float, target: float | None, spread: bool, matched_inside: bool, steps: float = math.nan
) -> str | None:
    if target is None:
        return None
    if abs(raw) <= target:
        return "met"
    if abs(matched) <= target:
        return "drift"
    if abs(steps) <= target:
        return "speed"
    return "spread" if spread and matched_inside else "unexplained"


def step_scales(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per cost model and real run: the oracle's cost_scale, 1 / (1 + its median step residual)."""
    out = per_run[["cost_model", "cell", "repeat"]].copy()
    out["cost_scale"] = 1 / (1 + per_run["median_residual"])
    return out


def drift_matched(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (cell, cost model, metric): real mean and interval, raw and drift-matched error, verdict."""
    rows = []
    real_all = runs[runs["side"] == "real"]
    for cell, real in real_all.groupby("cell", sort=False):
        sims = runs[(runs["side"] == "sim") & (runs["cell"] == cell)]
        matched_all = runs[(runs["side"] == MATCHED) & (runs["cell"] == cell)]
        before_all = runs[(runs["side"] == MATCHED_BEFORE) & (runs["cell"] == cell)]
        oracle_all = runs[(runs["side"] == STEP_MATCHED) & (runs["cell"] == cell)]
        for cost_model, sim in sims.groupby("cost_model", sort=False):
            matched = matched_all[matched_all["cost_model"] == cost_model]
            oracle = oracle_all[oracle_all["cost_model"] == cost_model]
            before = before_all[before_all["cost_model"] == cost_model]
            if not len(matched):
                continue
            for metric in METRICS:
                values = real[metric].to_numpy(dtype=float)
                mean = float(np.nanmean(values)) if np.isfinite(values).any() else math.nan
                lo, hi = within_range(metric, *t_interval(values))
                half = (hi - lo) / 2 / mean if mean else math.nan
                target = TARGETS.get(metric)
                raw = float(sim[metric].iloc[0])
                value = float(matched[metric].astype(float).mean())
                steps = float(oracle[metric].astype(float).mean()) if len(oracle) else math.nan
                first = float(before[metric].astype(float).mean()) if len(before) else math.nan
                spread = bool(target is not None and math.isfinite(half) and half > target)
                raw_err, matched_err, steps_err = _error(raw, mean), _error(value, mean), _error(steps, mean)
                inside = _inside(value, lo, hi)
                rows.append(
                    {
                        "cell": cell,
                        "cost_model": cost_model,
                        "metric": metric,
                        "real_mean": mean,
                        "real_ci_low": lo,
                        "real_ci_high": hi,
                        "real_n": int(np.isfinite(values).sum()),
                        "real_ci_rel_halfwidth": half,
                        "target": target,
                        "spread_exceeds_target": spread if target is not None else None,
                        "sim_raw": raw,
                        "raw_error": raw_err,
                        "raw_inside": _inside(raw, lo, hi),
                        "sim_matched": value,
                        "matched_error": matched_err,
                        "matched_inside": inside,
                        "matched_runs": len(matched),
                        "cost_scale_mean": float(matched["cost_scale"].mean()),
                        "sim_matched_before": first,
                        "matched_before_error": _error(first, mean),
                        "matched_before_inside": _inside(first, lo, hi),
                        "cost_scale_before_mean": float(before["cost_scale"].mean()) if len(before) else math.nan,
                        "sim_step_matched": steps,
                        "step_matched_error": steps_err,
                        "step_matched_inside": _inside(steps, lo, hi),
                        "verdict": verdict(raw_err, matched_err, target, spread, inside, steps_err),
                    }
                )
    return pd.DataFrame(rows)


def knee_verdict(real_mean: float, bound: bool, raw: float, matched: float, spread: bool, inside: bool) -> str:
    """A knee's verdict: none found in the grid, one only bounded by the grid's top, else as a figure's."""
    if not math.isfinite(real_mean):
        return NO_KNEE
    if bound:
        return PAST_GRID
    return verdict(raw, matched, KNEE_TARGET, spread, inside) or ""


def knee_matched(runs: pd.DataFrame, attainment: float = 0.9) -> pd.DataFrame:
    """Per trace and cost model: the real knee (per repeat, mean, interval), the raw simulated knee and the
    drift-matched one (per repeat from the open cells' matched simulations of that repeat, then the mean)."""
    rows = []
    open_runs = runs[runs["mode"] == "open"]
    for trace, group in open_runs.groupby("trace", sort=False):
        real = group[group["side"] == "real"]
        real_found = [knee(g["offered_rate"], g["slo_attainment"], attainment) for _, g in real.groupby("repeat")]
        real_knees = [value for value, _ in real_found]
        real_bound = any(bound for _, bound in real_found)
        mean = float(np.nanmean(real_knees)) if np.isfinite(real_knees).any() else math.nan
        lo, hi = t_interval(real_knees)
        for cost_model, sim in group[group["side"] == "sim"].groupby("cost_model", sort=False):
            matched = group[(group["side"] == MATCHED) & (group["cost_model"] == cost_model)]
            if not len(matched):
                continue
            raw, raw_bound = knee(sim["offered_rate"], sim["slo_attainment"], attainment)
            matched_found = [
                knee(g["offered_rate"], g["slo_attainment"], attainment) for _, g in matched.groupby("repeat")
            ]
            per_repeat = [value for value, _ in matched_found]
            bound = real_bound or raw_bound or any(b for _, b in matched_found)
            value = float(np.nanmean(per_repeat)) if np.isfinite(per_repeat).any() else math.nan
            half = (hi - lo) / 2 / mean if mean else math.nan
            spread = bool(math.isfinite(half) and half > KNEE_TARGET)
            raw_err, matched_err = _error(raw, mean), _error(value, mean)
            inside = _inside(value, lo, hi)
            rows.append(
                {
                    "trace": trace,
                    "cost_model": cost_model,
                    "real_knee_mean": mean,
                    "real_ci_low": lo,
                    "real_ci_high": hi,
                    "real_ci_rel_halfwidth": half,
                    "sim_raw": raw,
                    "raw_error": raw_err,
                    "raw_inside": _inside(raw, lo, hi),
                    "sim_matched": value,
                    "matched_knees": per_repeat,
                    "matched_error": matched_err,
                    "matched_inside": inside,
                    "target": KNEE_TARGET,
                    "spread_exceeds_target": spread,
                    "knee_is_lower_bound": bound,
                    "verdict": knee_verdict(mean, bound, raw_err, matched_err, spread, inside),
                }
            )
    return pd.DataFrame(rows)


def _pct(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.1f}%"


def _both_probes(row) -> bool:
    """The matching used a probe after the run as well (its scale differs from the probe before's alone)."""
    before = row.get("cost_scale_before_mean", math.nan)
    return bool(math.isfinite(before) and not math.isclose(before, row["cost_scale_mean"], rel_tol=1e-12))


def markdown(
    table: pd.DataFrame, knees: pd.DataFrame, gauge: pd.DataFrame, header: str, segments: pd.DataFrame | None = None
) -> str:
    """drift_matched.md: per cost model, each targeted figure raw -> matched error with marks, the verdict
    counts, the knee and the probe gauge."""
    from experiments.results.environment import markdown_table

    marks = {"met": "M", "drift": "D", "speed": "V", "spread": "S", "unexplained": "U"}
    lines = [header, ""]
    lines += [
        "Each entry: raw error -> drift-matched error against the real mean (SIMULATED vs real); `in` = the "
        "matched figure lies inside the real 95% interval; `{b ...}` = the error matched to the probe before "
        "each run alone (shown where a probe after the run was timed: the matching then uses the mean of both); "
        "`[s ...]` = the error at each run's own step speed (the oracle, when simulated); `(h)` = the real "
        "interval's half-width; verdict " + ", ".join(f"{marks[k]} = {v}" for k, v in VERDICTS.items()) + ".",
        "",
    ]
    targeted = [m for m in METRICS if m in TARGETS]
    for cost_model, g in table.groupby("cost_model", sort=False):
        lines += [f"### executor.cost_model={cost_model} (SIMULATED)", ""]
        body = []
        for cell, c in g.groupby("cell", sort=False):
            by = c.set_index("metric")
            row = [cell, f"{by['cost_scale_mean'].iloc[0]:.3f}"]
            for m in targeted:
                r = by.loc[m]
                oracle = f" [s {_pct(r['step_matched_error'])}]" if math.isfinite(r["step_matched_error"]) else ""
                first = f" {{b {_pct(r['matched_before_error'])}}}" if _both_probes(r) else ""
                row.append(
                    f"{_pct(r['raw_error'])} -> {_pct(r['matched_error'])}{' in' if r['matched_inside'] else ''}"
                    f"{first}{oracle} (h {100 * r['real_ci_rel_halfwidth']:.0f}%) {marks[r['verdict']]}"
                )
            thr = by.loc["request_throughput"]
            row.append(
                f"{_pct(thr['raw_error'])} -> {_pct(thr['matched_error'])}{' in' if thr['matched_inside'] else ''}"
            )
            body.append(row)
        lines += [markdown_table(["cell", "mean scale", *targeted, "request_throughput"], body), ""]
        counts = g["verdict"].value_counts()
        lines += [
            "Verdicts over the targeted figures: "
            + ", ".join(f"{k} {int(counts.get(k, 0))}" for k in VERDICTS)
            + f" (of {int(counts.sum())}).",
            "",
        ]
    if len(knees):
        lines += ["### Capacity knee, req/s (target 5%)", ""]
        lines += [
            markdown_table(
                [
                    "trace",
                    "cost model",
                    "real mean [95% CI]",
                    "raw sim (error)",
                    "matched sim (error)",
                    "in",
                    "verdict",
                ],
                [
                    [
                        r.trace,
                        r.cost_model,
                        f"{r.real_knee_mean:.3g} [{r.real_ci_low:.3g}, {r.real_ci_high:.3g}]",
                        f"{r.sim_raw:.3g} ({_pct(r.raw_error)})",
                        f"{r.sim_matched:.3g} ({_pct(r.matched_error)})",
                        "yes" if r.matched_inside else "no",
                        r.verdict,
                    ]
                    for r in knees.itertuples()
                ],
            ),
            "",
        ]
    if len(gauge):
        lines += [
            "### Is the probe a faithful gauge? Per real run: median step residual vs probe / reference",
            "",
            "Faithful: Pearson r near -1 and slope -1 (log(1 + residual) on log(ratio)); matched residual near 0. "
            "Probe: timed before the run, after it, or their mean (the matching's choice where both were timed).",
            "",
            markdown_table(
                [
                    "cost model",
                    "probe",
                    "runs",
                    "Pearson r",
                    "slope (s.e.)",
                    "probe ratio range",
                    "median residual raw",
                    "matched",
                    "median |residual| raw",
                    "matched",
                ],
                [
                    [
                        r.cost_model,
                        getattr(r, "probe", "before"),
                        r.runs,
                        f"{r.pearson_r:+.2f}",
                        f"{r.slope:+.2f} ({r.slope_stderr:.2f})",
                        f"{r.probe_ratio_min:.3f}-{r.probe_ratio_max:.3f}",
                        _pct(r.median_residual_raw),
                        _pct(r.median_residual_matched),
                        f"{100 * r.median_abs_residual_raw:.1f}%",
                        f"{100 * r.median_abs_residual_matched:.1f}%",
                    ]
                    for r in gauge.itertuples()
                ],
            ),
            "",
        ]
    if segments is not None and len(segments):
        lines += [
            "### The gauge by part of the run: Pearson r / slope (s.e.) of the run part's median step residual on "
            "the probe ratio",
            "",
            "A probe that measures its own moment but not a speed that moves during the run gauges the part next "
            "to it best (before: the first fifth; after: the last fifth).",
            "",
        ]
        body = []
        for (cost_model, probe), g in segments.groupby(["cost_model", "probe"], sort=False):
            by = g.set_index("part")
            body.append(
                [cost_model, probe]
                + [
                    f"{by.loc[p, 'pearson_r']:+.2f} / {by.loc[p, 'slope']:+.2f} ({by.loc[p, 'slope_stderr']:.2f})"
                    for p in by.index
                ]
            )
        parts = list(dict.fromkeys(segments["part"]))
        lines += [markdown_table(["cost model", "probe", *parts], body), ""]
    return "\n".join(lines) + "\n"
