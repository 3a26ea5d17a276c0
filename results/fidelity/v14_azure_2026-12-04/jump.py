"""Where does the real step time jump between 128 and 130 tokens? Operators one by one at a fine grid, then lone prefills.

    OMP_NUM_THREADS=1 python results/fidelity/v14_azure_2026-12-04/jump.py   # output: jump.txt (2026-12-04 18:45 UTC, main 46b0fde)
"""
import sys, torch
torch.set_num_threads(1)
from experiments.calibration.calibrate import build
from experiments.calibration import operator_bench as ob
from experiments.calibration.step_shapes import measure
engine = build(["model=smollm2-135m", "kernel=cpu"])
measure(engine, [(64, 4)] * 2, seed=999)
pts = [int(a) for a in sys.argv[1:]] or [64, 112, 120, 127, 128, 129, 130, 136, 160, 256]
orig = ob.grids
def grids(*a, **k):
    g = orig(*a, **k); g["tokens"] = pts; g["prefill"] = [(q, 0) for q in pts]; g["decode"] = []; g["logits"] = [1]
    return g
ob.grids = grids
out = ob.operator_samples(engine, repeats=5)
L = out["layers"]
for (n, lin), (_, na), (q, c, at) in zip(out["linear"], out["norm_act"], out["attn_prefill"]):
    print(f"{n:5d} linear {lin*1e3*L:8.2f} ms  norm_act {na*1e3*L:7.2f}  attn {at*1e3*L:7.2f}  (x{L} layers)")
# whole lone prefills, each shape 3 times
for p in pts:
    shapes, times = measure(engine, [(p, 1)] * 3, seed=1, sequential=True)
    print(p, "lone prefill steps (ms):", [round(t * 1e3, 1) for t in times])
