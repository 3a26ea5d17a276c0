"""The linear-layer microbenchmark runs every layer in turn, as a step does: one layer called again and again keeps
its weights in cache and times the projections compute-bound, which on a CPU made decode batches of 9-24 sequences
look 5-17% dearer than real steps (results/fidelity/v18_2026-12-04/hot_cold.txt)."""

from collections import Counter

from experiments.calibration.calibrate import build
from experiments.calibration.operator_bench import operator_samples


def test_every_layer_is_timed_and_the_time_is_per_layer():
    engine = build(["model=tiny", "kernel=torch", "cache.memory_gb=0.0625"])
    layers = engine.model.model.layers
    calls: Counter = Counter()
    for i, layer in enumerate(layers):
        proj = layer.self_attn.qkv_proj
        original = proj.forward
        proj.forward = lambda *a, i=i, original=original: calls.update([i]) or original(*a)
    out = operator_samples(engine, quick=True)
    assert len(layers) > 1 and sorted(calls) == list(range(len(layers)))
    assert len(set(calls.values())) == 1  # each layer as often as the others
    assert out["layers"] == len(layers) and all(seconds > 0 for _, seconds in out["linear"])
