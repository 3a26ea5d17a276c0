"""v18's real decode steps (its three studies) repriced by v18's profile and by one calibrated with the linear
layers timed across all layers in turn (all_layers/profile, 23:32-23:38): median predicted / measured - 1 by batch size.

    python results/fidelity/v18_2026-12-04/all_layers/reprice_decode.py results/fidelity/v18_2026-12-04/all_layers/profile
"""
import sys
from pathlib import Path
import pandas as pd
from experiments.studies.fidelity_reanalyze import reprice
V = Path("results/fidelity/v18_2026-12-04")
s = pd.concat([pd.read_csv(V / p / "step_residuals.csv") for p in ("synthetic", "synthetic_low", "azure")])
s = s[s.kind == "decode"]
old = sorted((V / "profile").glob("*.json"))[0]
new = sorted(Path(sys.argv[1]).glob("*.json"))[0]
rows = []
for label, prof in (("v18 profile (layer 0 hot)", old), ("all layers in turn", new)):
    r = reprice(s, prof)
    r["err"] = r.predicted_s / r.measured_s - 1
    g = r.groupby(["decode_seqs", "cost_model"]).err.median().unstack("cost_model")
    g.columns = [f"{label}: {c}" for c in g.columns]
    rows.append(g)
n = s[s.cost_model == "profile"].groupby("decode_seqs").size().rename("steps")
t = pd.concat([n, *rows], axis=1)
t = t[t.steps >= 8]
print(t.to_string(float_format=lambda v: f"{100 * v:+.1f}%"))
