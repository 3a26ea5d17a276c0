"""One layer's linear projections (x 30 layers, ms) at every row count 1-40: the packed kernel's row-tile staircase.

    OMP_NUM_THREADS=1 python results/fidelity/v15_2026-12-04/stairs.py   # output: stairs.txt
"""
import torch
torch.set_num_threads(1)
from experiments.calibration.calibrate import build
from experiments.calibration import operator_bench as ob
engine = build(["model=smollm2-135m", "kernel=cpu"])
orig = ob.grids
def grids(*a, **k):
    g = orig(*a, **k); g["linear"] = list(range(1, 41)); g["tokens"] = [1]; g["prefill"] = [(16, 0)]; g["decode"] = []; g["logits"] = [1]
    return g
ob.grids = grids
import experiments.calibration.refine as rf
out = ob.operator_samples(engine, repeats=5)
print(" ".join(f"{n}:{s*1e3*out['layers']:.1f}" for n, s in out["linear"]))
