"""v18's real pure-decode steps by batch size (all three of its studies): median measured step time and what each
cost model predicted (ms), for sizes with >= 8 steps. Shows where the ~10% over-pricing of 9-24-sequence decode
steps enters: the real step is flat within 9-12 sequences while the prediction climbs.

    python results/fidelity/v18_2026-12-04/decode_by_seqs.py > results/fidelity/v18_2026-12-04/decode_by_seqs.txt
"""

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
s = pd.concat([pd.read_csv(HERE / part / "step_residuals.csv") for part in ("synthetic", "synthetic_low", "azure")])
s = s[s.kind == "decode"]
g = s.groupby(["decode_seqs", "cost_model"]).agg(steps=("measured_s", "size"), measured=("measured_s", "median"),
                                                 predicted=("predicted_s", "median")).unstack("cost_model")
g = g[g[("steps", "profile")] >= 8]
out = pd.DataFrame({
    "steps": g[("steps", "profile")],
    "measured_ms": 1e3 * g[("measured", "profile")],
    "profile_ms": 1e3 * g[("predicted", "profile")],
    "operators_ms": 1e3 * g[("predicted", "operators")],
})
out["profile_err"] = out.profile_ms / out.measured_ms - 1
out["operators_err"] = out.operators_ms / out.measured_ms - 1
print("# v18 real decode steps by batch size: median measured vs predicted (SIMULATED prices), ms\n")
print(out.to_string(float_format=lambda v: f"{v:.1f}" if abs(v) >= 1 else f"{100 * v:+.1f}%"))
