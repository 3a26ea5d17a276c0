"""The linear-layer microbenchmark runs every layer in turn, as a step does: one layer called again and again keeps
its weights in cache and times the projections compute-bound, which on a CPU made decode batches of 9-24 sequences
look 5-17% dearer than real steps (results/fidelity/v18_2026-12-04/hot_cold.txt)."""

from collections import Counter

from experiments.calibration import operator_bench
from experiments.calibration.calibrate import build
from experiments.calibration.operator_bench import operator_samples


def test_every_layer_is_timed_in_turn():
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


def test_the_linear_time_is_per_layer(monkeypatch):
    """A call over all layers that takes 1 s is 1 / L s per layer (the cost model multiplies by L again)."""

    def one_second(self, fn, *args):
        fn(*args)
        return 1.0

    monkeypatch.setattr(operator_bench._Timer, "__call__", one_second)
    engine = build(["model=tiny", "kernel=torch", "cache.memory_gb=0.0625"])
    out = operator_samples(engine, quick=True)
    assert {seconds for _, seconds in out["linear"]} == {1.0 / out["layers"]}
