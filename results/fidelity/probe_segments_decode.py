"""The probe gauge by part of the run, pure decode steps only, for the committed studies v2-v4.

    python results/fidelity/probe_segments_decode.py > results/fidelity/probe_segments_decode.txt

A run's first fifth holds more prefill and mixed steps than its rest; fitting the gauge on the pure decode
steps of each part alone tells the time since the probe from the step mix. Reads each folder's
step_residuals.csv and probe_gauge_runs.csv (the probe ratio against the calibration's mean probe).
"""

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

HERE = Path(__file__).resolve().parent
SEGMENTS = 5  # as experiments.studies.fidelity_drift.SEGMENTS

for folder in ("v2_2026-12-02", "v3_2026-12-03", "v4_2026-12-03"):
    steps = pd.read_csv(HERE / folder / "step_residuals.csv")
    runs = pd.read_csv(HERE / folder / "probe_gauge_runs.csv")
    for model in ("profile", "operators"):
        ratio = runs[runs["cost_model"] == model].set_index(["cell", "repeat"])["probe_ratio"]
        share, points = {"first": [], "rest": []}, {"first": [], "last": []}
        for (cell, repeat), g in steps[steps["cost_model"] == model].groupby(["cell", "repeat"], sort=False):
            k = max(len(g) // SEGMENTS, 1)
            err = (g["predicted_s"] / g["measured_s"] - 1).to_numpy()
            decode = (g["kind"] == "decode").to_numpy()
            share["first"].append(1 - decode[:k].mean())
            share["rest"].append(1 - decode[k:].mean())
            for part, sl in (("first", slice(0, k)), ("last", slice(len(g) - k, len(g)))):
                e = err[sl][decode[sl]]
                if len(e) >= 3:  # a part with fewer decode steps has no median worth fitting
                    points[part].append((ratio.loc[(cell, repeat)], float(np.median(e))))
        print(
            f"{folder} {model}: prefill/mixed share of a run's first fifth {np.mean(share['first']):.3f}, "
            f"of its rest {np.mean(share['rest']):.3f} (mean over {len(share['first'])} runs)"
        )
        for part, pts in points.items():
            x, y = np.log([p[0] for p in pts]), np.log1p([p[1] for p in pts])
            fit = stats.linregress(x, y)
            print(
                f"  {part} fifth, pure decode: {len(pts)} runs, r {fit.rvalue:+.2f}, slope {fit.slope:+.2f} "
                f"(s.e. {fit.stderr:.2f})"
            )
