"""Is the probe a faithful gauge of the machine's speed? Tables over a fidelity study's real runs.

probe_gauge     per real run, its median step residual against its probe ratio, for the probe before, after
                and their mean: a faithful gauge makes (1 + residual) x ratio = 1, i.e. log(1 + residual)
                against log(ratio) a slope of -1
probe_gauge_segments  the same fit for the first and last fifth of each run's steps: which moment a probe
                gauges (a speed that moves during the run: the probe before gauges the first fifth best)
"""

import math

import numpy as np
import pandas as pd

from experiments.studies.fidelity_drift import cost_scales
from experiments.studies.fidelity_report import step_kind


def probe_gauge_runs(steps: pd.DataFrame, runs: pd.DataFrame, reference: float) -> pd.DataFrame:
    """Per cost model and real run: its median step residual (all busy steps, and pure decode), its probe
    ratios (`probe_ratio`: the run probe the matching uses; `_before`, `_after`: each probe alone), and the
    residual once the price is matched to `probe_ratio`."""
    ratios = ["cost_scale", "cost_scale_before", "cost_scale_after"]
    real = cost_scales(runs, reference)[["cell", "repeat", "probe_s", "probe_after_s", *ratios]]
    steps = steps.assign(repeat=steps["repeat"].astype(int))
    if "kind" not in steps:
        steps = steps.assign(kind=[step_kind(p, d) for p, d in zip(steps["prefill_seqs"], steps["decode_seqs"])])
    rows = []
    for (cost_model, cell, repeat), g in steps.groupby(["cost_model", "cell", "repeat"], sort=False):
        err = g["predicted_s"] / g["measured_s"] - 1
        decode = err[g["kind"] == "decode"]
        rows.append(
            {
                "cost_model": cost_model,
                "cell": cell,
                "repeat": repeat,
                "steps": len(g),
                "median_residual": float(err.median()),
                "decode_steps": len(decode),
                "decode_median_residual": float(decode.median()) if len(decode) else math.nan,
            }
        )
    out = pd.DataFrame(rows).merge(real, on=["cell", "repeat"], how="left")
    out = out.rename(columns=dict(zip(ratios, ["probe_ratio", "probe_ratio_before", "probe_ratio_after"])))
    out["matched_median_residual"] = (1 + out["median_residual"]) * out["probe_ratio"] - 1
    return out


# probe_gauge's rows: which probe ratio gauges the runs (the run probe = the before/after mean where timed)
GAUGES = {"before": "probe_ratio_before", "after": "probe_ratio_after", "mean": "probe_ratio"}


def probe_gauge(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per cost model and probe (before the run, after it, their mean; only `before` where no probe after
    was timed): how well the probe ratio predicts a run's step residual. Pearson r and the slope of
    log(1 + residual) on log(probe ratio) (a faithful gauge: r near -1, slope -1), the median residual
    raw and matched to that probe, over the real runs."""
    rows = []
    timed_after = "probe_ratio_after" in per_run and bool(np.isfinite(per_run["probe_ratio_after"]).any())
    for cost_model, runs in per_run.groupby("cost_model", sort=False):
        for probe, column in GAUGES.items():
            if probe != "before" and not timed_after:
                continue
            g = runs[np.isfinite(runs[column]) & np.isfinite(runs["median_residual"])]
            matched = (1 + g["median_residual"]) * g[column] - 1
            rows.append(
                {
                    "cost_model": cost_model,
                    "probe": probe,
                    **_gauge_fit(g[column], g["median_residual"]),
                    "probe_ratio_min": float(g[column].min()),
                    "probe_ratio_max": float(g[column].max()),
                    "median_residual_raw": float(g["median_residual"].median()),
                    "median_residual_matched": float(matched.median()),
                    "median_abs_residual_raw": float(g["median_residual"].abs().median()),
                    "median_abs_residual_matched": float(matched.abs().median()),
                }
            )
    return pd.DataFrame(rows)


def _gauge_fit(ratio: pd.Series, residual: pd.Series) -> dict:
    """Pearson r and the slope of log(1 + residual) on log(probe ratio) over runs (NaN below 3 runs)."""
    from scipy import stats

    x, y = np.log(ratio.to_numpy(dtype=float)), np.log1p(residual.to_numpy(dtype=float))
    fit = stats.linregress(x, y) if len(x) >= 3 and np.ptp(x) > 0 else None
    return {
        "runs": len(x),
        "pearson_r": float(fit.rvalue) if fit else math.nan,
        "slope": float(fit.slope) if fit else math.nan,
        "slope_stderr": float(fit.stderr) if fit else math.nan,
        "p_value": float(fit.pvalue) if fit else math.nan,
    }


SEGMENTS = 5  # a run's busy steps in fifths: the first follows the probe before, the last precedes the probe after


def probe_gauge_segments(steps: pd.DataFrame, runs: pd.DataFrame, reference: float) -> pd.DataFrame:
    """Per cost model, part of each run (its first fifth of busy steps in step order, its last fifth, all of
    them) and probe (before, after, their mean; `before` alone where none was timed after): the gauge's
    Pearson r and slope. A probe that measures its own moment but not a speed that moves during the run
    gauges the part next to it best: the probe before the first fifth, the probe after the last."""
    real = cost_scales(runs, reference).set_index(["cell", "repeat"])
    timed_after = bool(np.isfinite(real["cost_scale_after"]).any())
    probes = {"before": "cost_scale_before", "after": "cost_scale_after", "mean": "cost_scale"}
    steps = steps.assign(repeat=steps["repeat"].astype(int))
    rows = []
    for cost_model, by_model in steps.groupby("cost_model", sort=False):
        parts = []
        for (cell, repeat), g in by_model.groupby(["cell", "repeat"], sort=False):
            err = (g["predicted_s"] / g["measured_s"] - 1).to_numpy()
            k = max(len(err) // SEGMENTS, 1)
            ratios = {p: real.loc[(cell, repeat), c] for p, c in probes.items()}
            parts += [
                {"part": part, **ratios, "median_residual": float(np.median(e))}
                for part, e in (("first fifth", err[:k]), ("last fifth", err[-k:]), ("whole run", err))
            ]
        table = pd.DataFrame(parts)
        for part, g in table.groupby("part", sort=False):
            for probe in probes if timed_after else ["before"]:
                ok = g[np.isfinite(g[probe].astype(float))]
                rows.append(
                    {
                        "cost_model": cost_model,
                        "part": part,
                        "probe": probe,
                        **_gauge_fit(ok[probe], ok["median_residual"]),
                    }
                )
    return pd.DataFrame(rows)
