r"""Azure open 120% (v9) simulated at the busy-time ratio of its real steps (SIMULATED).

    python results/fidelity/v9_2026-12-03/busy120.py 2>/dev/null | grep "cost_scale\|busy" > results/fidelity/v9_2026-12-03/busy120.txt
"""
import json, tempfile
from pathlib import Path
import pandas as pd
from experiments.studies.fidelity_reanalyze import cell_overrides, simulate
F = Path("results/fidelity/v9_2026-12-03"); P = next((F / "profile").glob("*.json"))
meta = json.loads(P.read_text()); setup = [f"model={meta['model']}", f"kernel={meta['kernel']}"]
runs = pd.read_csv(F / "runs.csv"); steps = pd.read_csv(F / "step_residuals.csv")
cell = "azure_open_120pct"
st = steps[(steps.cell == cell) & (steps.cost_model == "profile")]
ratio = st.predicted_s.sum() / st.measured_s.sum()
row = runs[(runs.cell == cell) & (runs.side == "real")].iloc[0]
real = runs[(runs.cell == cell) & (runs.side == "real")]
ov = [*setup, *cell_overrides(F, row, "profile")]
with tempfile.TemporaryDirectory() as tmp:
    for scale in (1.0, 1 / ratio):
        s = simulate(ov, P, "profile", Path(tmp) / f"s{scale:.3f}", scale)
        print(f"cost_scale {scale:.4f}: " + ", ".join(f"{m} {s[m]:.1f} ({s[m]/real[m].mean()-1:+.1%})" for m in ("median_ttft_ms", "median_e2el_ms", "p99_e2el_ms")))
print("busy ratio predicted/measured", round(ratio, 4), "real means", {m: round(real[m].mean(), 1) for m in ("median_ttft_ms", "median_e2el_ms", "p99_e2el_ms")})
