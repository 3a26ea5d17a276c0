"""The operator-level cost model (testbed/sim/cost_models/operators.py): fitted on timings planted from a
known generating model it recovers the parameters and prices batch shapes it never saw; on the tiny model's
real microbenchmarks, calibration writes it and a simulation runs on it."""

import json
import random

import pytest

from experiments.calibration.operator_bench import grids
from experiments.run.runner import run_trace
from testbed.sim.cost_models.curves import interpolate
from testbed.sim.cost_models.operators import DECODE, HOST, PREFILL, Operators, fit_operators

from .test_cost_models import synthetic_shapes
from .test_sim_runs import SMALL_TRACE, cfg

LAYERS = 6
TRUTH = {
    "linear": lambda n: 3e-4 + 2e-6 * n,  # per layer
    "norm_act": lambda n: 2e-5 + 1e-7 * n,
    "logits": lambda m: 1e-3 + 4e-5 * m,
    "attn_prefill": dict(zip(PREFILL, (5e-5, 1e-7, 2e-10))),  # per chunk, token, query-key pair (per layer)
    "attn_decode": dict(zip(DECODE, (3e-5, 2e-7, 5e-9))),  # once, per row, per KV token read (per layer)
    "host": dict(zip(HOST, (1.5e-3, 4e-5, 2e-6))),
}


def true_step(s) -> float:
    per_layer = TRUTH["linear"](s.num_tokens) + TRUTH["norm_act"](s.num_tokens)
    if s.prefill_seqs:
        a, b, c = TRUTH["attn_prefill"].values()
        per_layer += a * s.prefill_seqs + b * s.prefill_tokens + c * s.prefill_pairs
    if s.decode_seqs:
        a, b, c = TRUTH["attn_decode"].values()
        per_layer += a + b * s.decode_tokens + c * s.decode_context
    h0, h1, h2 = TRUTH["host"].values()
    logits = TRUTH["logits"](s.num_logits) if s.num_logits else 0.0
    return LAYERS * per_layer + logits + h0 + h1 * s.num_seqs + h2 * s.num_tokens


def planted(noise: float, seed: int = 0):
    rng = random.Random(seed)
    jitter = lambda t: t * rng.uniform(1 - noise, 1 + noise)
    g = grids(max_tokens=512, max_seqs=64, max_len=8192, quick=False)
    pf, dc = TRUTH["attn_prefill"], TRUTH["attn_decode"]
    samples = {
        "layers": LAYERS,
        **{op: [(n, jitter(TRUTH[op](n))) for n in g["tokens"]] for op in ("linear", "norm_act")},
        "logits": [(m, jitter(TRUTH["logits"](m))) for m in g["logits"]],
        "attn_prefill": [
            (q, c, jitter(pf["chunks"] + pf["tokens"] * q + pf["pairs"] * q * (c + (q + 1) / 2)))
            for q, c in g["prefill"]
        ],
        "attn_decode": [
            (b, b * ctx, jitter(dc["step"] + dc["rows"] * b + dc["context"] * b * ctx)) for b, ctx in g["decode"]
        ],
    }
    shapes = synthetic_shapes(300, seed=seed)
    return samples, shapes, [jitter(true_step(s)) for s in shapes]


def test_recovers_a_planted_model_and_prices_unseen_shapes():
    samples, shapes, seconds = planted(noise=0.02)
    section = fit_operators(samples, shapes, seconds)
    for part in ("attn_prefill", "attn_decode"):
        for key, value in TRUTH[part].items():
            assert section[part][key] == pytest.approx(value, rel=0.15), (part, key)
    for key, value in TRUTH["host"].items():
        assert section["host"][key] == pytest.approx(value, rel=0.25, abs=2e-7), ("host", key)
    ops = Operators(json.loads(json.dumps(section)))  # what a profile file holds prices the same
    unseen = synthetic_shapes(200, seed=7)  # batch shapes no microbenchmark or calibration step had
    errors = sorted(abs(ops.step_time(s) - true_step(s)) / true_step(s) for s in unseen)
    assert errors[len(errors) // 2] < 0.02 and errors[-1] < 0.06
    assert section["fit"]["median_abs_rel_err"] < 0.02


def test_fit_is_sensitive_to_each_operator():
    """Doubling one operator's planted time moves the priced steps: no part is ignored."""
    samples, shapes, seconds = planted(noise=0.0)
    base = Operators(fit_operators(samples, shapes, seconds))
    probe = synthetic_shapes(50, seed=3)
    for op in ("linear", "norm_act", "logits", "attn_prefill", "attn_decode"):
        slow = {**samples, op: [(*row[:-1], 2 * row[-1]) for row in samples[op]]}
        fitted = Operators(fit_operators(slow, shapes, seconds))
        moved = sum(fitted.device_time(s) - base.device_time(s) for s in probe)
        assert moved > 0, op


def test_interpolation_extrapolates_with_the_end_slopes():
    curve = {"x": [1, 4, 16], "seconds": [1.0, 2.0, 5.0]}
    assert interpolate(curve, 10) == pytest.approx(3.5)
    assert interpolate(curve, 32) == pytest.approx(9.0)
    assert interpolate(curve, 0) == pytest.approx(2 / 3)


def test_calibrate_and_simulate_the_tiny_model_on_its_operators(tmp_path, monkeypatch):
    """Smoke: real CPU microbenchmarks of the tiny model, a profile with its operators (self-check limits
    opened: this test is about the code path, not this machine's noise), then a simulation priced by them."""
    import experiments.calibration.calibrate as calibrate

    monkeypatch.setenv("TESTBED_KERNEL", "torch")
    W = calibrate.Workload
    small = [W("prefill", [(40, 2)] * 3), W("decode", [(48, 4)] * 4), W("mixed", [(24, 6), (60, 3), (8, 5)])]
    monkeypatch.setattr(calibrate, "workloads", lambda max_len, quick: small)
    path = calibrate.main(
        [
            "model=tiny",
            "kernel=torch",
            "cache.memory_gb=0.0625",  # zeroed at start-up; these workloads use a few MiB of it
            "--quick",
            "--out",
            str(tmp_path),
            "--probe-repeats",
            "1",
            "--warmup",
            "1",
            "--force",
        ]
    )
    profile = json.loads(path.read_text())
    section = profile["operators"]
    assert section["layers"] == 2 and set(section["host"]) == set(HOST)
    assert all(t > 0 for t in section["linear"]["seconds"]) and len(section["microbenchmarks"]["attn_decode"]) == 4
    overrides = ["model=tiny", "kernel=torch", *SMALL_TRACE]
    sim = run_trace(
        cfg(*overrides, "executor=sim", "executor.cost_model=operators", f"executor.profile={path}"), tmp_path / "sim"
    )
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["sim_cost_model"] == "operators" and sim["completed"] == 24 and sim["duration"] > 0
    with pytest.raises(ValueError, match="max_num_seqs=128 \\(microbenchmarked up to 64\\)"):
        run_trace(
            cfg(
                *overrides,
                "executor=sim",
                "executor.cost_model=operators",
                f"executor.profile={path}",
                "scheduler.max_num_seqs=128",
            ),
            tmp_path / "wide",
        )
