"""v8's verdicts with the profile refitted on its calibration without the lone-prefill steps (SIMULATED).

    python results/fidelity/v8_2026-12-03/refit_nolone.py > results/fidelity/v8_2026-12-03/refit_nolone.txt

Refits v8's stored calibration samples less the "lone prefills" workload with testbed/sim/cost_models/profile.py
`fit` (the calibration's other 709 steps: v7's workloads), writes that profile (v8's, with the refit's knee,
coefficients, fit and samples) into a scratch copy of the study folder whose step_residuals.csv is re-priced by it,
and runs `experiments.studies.fidelity_reanalyze --cost-models profile` there: the raw, probe-matched and
step-matched (oracle, from the re-priced residuals) simulations of every cell. Writes refit_nolone/ (the refit
profile, drift_matched.csv, knee_matched.csv, drift_matched.md) and prints the verdicts both ways.
"""

import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.studies import fidelity_reanalyze
from testbed.sim.cost_models.profile import FEATURES, feature_rows, fit
from testbed.sim.shape import StepShape

HERE = Path(__file__).resolve().parent
OUT = HERE / "refit_nolone"
SHAPE = list(StepShape.__dataclass_fields__)
TARGETED = ["median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms"]
MARK = {"met": "M", "drift": "D", "speed": "V", "spread": "S", "unexplained": "U"}


def refit_profile(profile: dict) -> dict:
    s = profile["samples"]
    keep = [i for i, w in enumerate(s["workload"]) if w != "lone prefills"]
    shapes = [StepShape(*s["shapes"][i]) for i in keep]
    seconds = [s["seconds"][i] for i in keep]
    result = fit(shapes, seconds)
    samples = {**s, **{k: [s[k][i] for i in keep] for k in ("workload", "shapes", "seconds")}}
    return {**profile, **result, "samples": samples}


def reprice(steps: pd.DataFrame, profile: dict) -> pd.DataFrame:
    """The profile model's rows of step_residuals.csv with predicted_s from `profile`."""
    rows = steps[steps.cost_model == "profile"].copy()
    shapes = [StepShape(*r) for r in rows[SHAPE].astype(object).itertuples(index=False)]
    coef = np.array([profile["coefficients"][f] for f in FEATURES])
    rows["predicted_s"] = feature_rows(shapes, profile["knee_tokens"]) @ coef
    return rows


def summary(table: pd.DataFrame, label: str) -> str:
    t = table[(table.cost_model == "profile") & table.metric.isin(TARGETED)]
    vc = t.verdict.map(MARK).value_counts()
    errs = " / ".join(f"{100 * t[c].abs().median():.1f}%" for c in ("raw_error", "matched_error", "step_matched_error"))
    inside = " / ".join(
        str(int(t[c].astype(str).eq("True").sum())) for c in ("raw_inside", "matched_inside", "step_matched_inside")
    )
    return (
        f"{label}: " + " ".join(f"{k} {vc.get(k, 0)}" for k in "MDVSU") + f" of {len(t)}; median |error| raw / "
        f"probe-matched / step-matched {errs}; inside the real 95% interval {inside}"
    )


def main() -> None:
    stored = json.loads(next((HERE / "profile").glob("*.json")).read_text())
    refit = refit_profile(stored)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / HERE.name
        (folder / "profile").mkdir(parents=True)
        (folder / "profile" / "refit.json").write_text(json.dumps(refit))
        shutil.copy(HERE / "runs.csv", folder / "runs.csv")
        reprice(pd.read_csv(HERE / "step_residuals.csv"), refit).to_csv(folder / "step_residuals.csv", index=False)
        for config in (HERE / "runs").glob("*/sim-profile/config.yaml"):
            target = folder / config.relative_to(HERE)
            target.parent.mkdir(parents=True)
            shutil.copy(config, target)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints drift_matched.md, kept in OUT
            fidelity_reanalyze.main([str(folder), "--cost-models", "profile"])
        OUT.mkdir(exist_ok=True)
        shutil.copy(folder / "profile" / "refit.json", OUT / "profile_without_lone_prefills.json")
        for name in ("drift_matched.csv", "knee_matched.csv"):
            shutil.copy(folder / name, OUT / name)
        scratch = (folder / "drift_matched.md").read_text().replace(str(folder), "<refit_nolone.py's scratch copy>")
        (OUT / "drift_matched.md").write_text(scratch)
    f = refit["fit"]
    print(
        f"Refit without the lone prefills: {f['samples']} steps, knee {refit['knee_tokens']:.0f}, coefficients "
        + ", ".join(f"{k} {v:.4g}" for k, v in refit["coefficients"].items())
        + f"; fit median |error| {100 * f['median_abs_rel_err']:.2f}%"
    )
    print(summary(pd.read_csv(HERE / "drift_matched.csv"), "v8 profile as calibrated (741 steps)"))
    print(summary(pd.read_csv(OUT / "drift_matched.csv"), "v8 profile refitted without lone prefills (709 steps)"))
    for label, path in (("as calibrated", HERE), ("refitted", OUT)):
        k = pd.read_csv(path / "knee_matched.csv")
        k = k[k.cost_model == "profile"]
        print(
            f"knee, {label}: "
            + "; ".join(
                f"{r.trace} raw {100 * r.raw_error:+.1f}% matched {100 * r.matched_error:+.1f}% {r.verdict}"
                for r in k.itertuples()
            )
        )
    a = pd.read_csv(HERE / "drift_matched.csv").set_index(["cell", "cost_model", "metric"])
    b = pd.read_csv(OUT / "drift_matched.csv").set_index(["cell", "cost_model", "metric"])
    both = a.merge(b, left_index=True, right_index=True, suffixes=("", "_refit"))
    both = both[both.index.get_level_values(2).isin(TARGETED)]
    moved = both[both.verdict != both.verdict_refit]
    print(f"verdicts that differ ({len(moved)} of {len(both)}):")
    for (cell, _, metric), r in moved.iterrows():
        print(
            f"   {cell} {metric}: {MARK[r.verdict]} {100 * r.raw_error:+.1f}% -> {MARK[r.verdict_refit]} "
            f"{100 * r.raw_error_refit:+.1f}% raw"
        )


if __name__ == "__main__":
    main()
