"""How the simulated p99 TPOT and p99 E2EL of v17's synthetic open 50% / 80% cells move with the cost scale
(SIMULATED): each cell's profile simulation re-run from its recorded config.yaml at cost scales 0.85-1.00. The
drift-matched scale of these cells was 0.91-0.92; a figure that swings by more than the target between neighbouring
scales cannot be settled by matching the machine's speed.

    python results/fidelity/v17_2026-12-04/synthetic_low/tail_sensitivity.py > .../tail_sensitivity.txt
"""

import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from experiments.run.runner import run_trace

HERE = Path(__file__).resolve().parent
SCALES = [0.85, 0.87, 0.89, 0.90, 0.91, 0.92, 0.93, 0.95, 0.97, 1.00]

for cell in ("synthetic_open_50pct", "synthetic_open_80pct"):
    base = OmegaConf.load(HERE / "runs" / cell / "sim-profile" / "config.yaml")
    real = [OmegaConf.load(HERE / "runs" / cell / f"real{i}" / "config.yaml") for i in range(3)]
    print(f"## {cell} (profile model)\n\n| cost scale | p99 TPOT ms | p99 E2EL ms | median TPOT ms |\n|---|---|---|---|")
    for scale in SCALES:
        cfg = base.copy()
        cfg.executor.cost_scale = scale
        cfg.progress = False
        with tempfile.TemporaryDirectory() as tmp:
            s = run_trace(cfg, Path(tmp) / "run")
        print(f"| {scale:.2f} | {s['p99_tpot_ms']:.1f} | {s['p99_e2el_ms']:.0f} | {s['median_tpot_ms']:.2f} |")
    print()
