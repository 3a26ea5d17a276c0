"""One layer's linear projections timed as the calibration times them (layer 0 called again and again: its ~16 MB of
float32 weights stay in cache) against all 30 layers called in turn as a real step does (weights streamed from
memory), ms per 30 layers, at 4-28 rows; median of 7 timings each, interleaved. Tests whether a cache-hot
microbenchmark explains why the priced decode step climbs inside the packed kernel's 12-row tile and the real one
does not (decode_by_seqs.txt).

    OMP_NUM_THREADS=1 python results/fidelity/v18_2026-12-04/hot_cold.py > results/fidelity/v18_2026-12-04/hot_cold.txt
"""

import statistics
import time

import torch

from experiments.calibration.calibrate import build

torch.set_num_threads(1)
engine = build(["model=smollm2-135m", "kernel=cpu"])
layers = engine.model.model.layers
arch = engine.arch
attn0 = layers[0].self_attn


def run(layer_list, n):
    x = torch.randn(n, arch.hidden_size)
    a = torch.randn(n, attn0.q_size)
    h = torch.randn(n, arch.intermediate_size)
    start = time.perf_counter()
    for layer in layer_list:
        layer.self_attn.qkv_proj(x), layer.self_attn.o_proj(a), layer.mlp.gate_up_proj(x), layer.mlp.down_proj(h)
    return time.perf_counter() - start


rows = [4, 6, 8, 9, 10, 11, 12, 13, 14, 16, 20, 24, 25, 28]
hot_list, cold_list = [layers[0]] * len(layers), list(layers)
with torch.inference_mode():
    for layer_list in (hot_list, cold_list):  # warm-up
        run(layer_list, 8)
    print("rows  hot_ms  cold_ms  cold/hot")
    for n in rows:
        hot, cold = [], []
        for _ in range(7):
            hot.append(run(hot_list, n))
            cold.append(run(cold_list, n))
        h, c = statistics.median(hot) * 1e3, statistics.median(cold) * 1e3
        print(f"{n:4d}  {h:6.1f}  {c:7.1f}  {c / h:6.2f}")
