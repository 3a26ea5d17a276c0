"""Real busy steps of a study priced by its profile, by the step's token count: median (predicted / measured - 1).
Shows the linear layers' 128/129-row cliff of the CPU backend (testbed_kernels.cpu.FEW_ROWS) as v13's profile
priced it (an operator grid of 1, 4, 16, 64, 256, 512 rows) and as v14's and later price it (every 16 rows,
split to one row where out of line: experiments/calibration/refine.py).

    python results/fidelity/steps_by_tokens.py v13_azure_knee_2026-12-04 v14_azure_2026-12-04 v14_synth_knee_2026-12-04 \
        v15_2026-12-04/azure v15_2026-12-04/synthetic v16_synth_2026-12-04 v17_2026-12-04/azure \
        v17_2026-12-04/synthetic v17_2026-12-04/synthetic_low v18_2026-12-04/azure v18_2026-12-04/synthetic \
        v18_2026-12-04/synthetic_low > steps_by_tokens.txt
"""

import sys
from pathlib import Path

import pandas as pd

EDGES = [0, 1, 8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 192, 256, 384, 512]
HERE = Path(__file__).parent


def table(study: str) -> pd.DataFrame:
    s = pd.read_csv(HERE / study / "step_residuals.csv")
    s["error"] = s.predicted_s / s.measured_s - 1
    s["tokens"] = pd.cut(s.num_tokens, EDGES)
    g = s.groupby(["tokens", "cost_model"], observed=True).agg(steps=("error", "size"), median=("error", "median"))
    return g.unstack("cost_model")


for study in sys.argv[1:]:
    t = table(study)
    print(f"## {study}: median (predicted / measured - 1) of its real busy steps, by token count\n")
    print(t.to_string(float_format=lambda v: f"{100 * v:+.1f}%" if abs(v) < 5 else f"{v:.0f}"))
    print()
