"""The simulator's parts on hand-built inputs: step shapes, the roofline model, profile fitting, clocks."""

import json
import random

import pytest

from testbed.core.sched_output import SchedulerOutput
from testbed.models.build import load_model_spec
from testbed.request import Request
from testbed.sampling_params import SamplingParams
from testbed.sim.clock import ClockDivergence, RecordingClock, ReplayClock, VirtualClock
from testbed.sim.cost_models.curves import interpolate
from testbed.sim.cost_models.profile import FEATURES, ProfileCost, fit
from testbed.sim.cost_models.roofline import RooflineCost
from testbed.sim.devices import load_device
from testbed.sim.shape import StepShape


def request(prompt_len, computed, outputs=0, drafts=0):
    r = Request("r", list(range(prompt_len)), SamplingParams(max_tokens=100))
    r.all_token_ids += [7] * outputs
    r.output_token_ids += [7] * outputs
    r.spec_token_ids = [7] * drafts
    r.num_computed_tokens = computed
    return r


def test_step_shape_counts_prefill_pairs_and_decode_context():
    chunk = request(100, 40)  # prefill positions 40..59: attends to 41..60 tokens
    last_chunk = request(30, 20)  # positions 20..29, reaches the prompt's end: one logits row
    decode = request(50, 52, outputs=3)  # 53 tokens known, 52 computed: attends to 53
    verify = request(10, 11, outputs=2, drafts=3)  # 12 known, 11 computed, 1 + 3 rows: 12 + 13 + 14 + 15
    requests = [chunk, last_chunk, decode, verify]
    out = SchedulerOutput(
        requests,
        [20, 10, 1, 4],
        num_computed_tokens=[r.num_computed_tokens for r in requests],
        num_known_tokens=[r.num_tokens for r in requests],
    )
    shape = StepShape.of(out)
    assert shape.num_seqs == 4 and shape.num_tokens == 35
    assert (shape.prefill_seqs, shape.prefill_tokens) == (2, 30)
    assert shape.prefill_pairs == sum(range(41, 61)) + sum(range(21, 31))
    assert shape.prefill_context == 60 + 30
    assert (shape.decode_seqs, shape.decode_tokens, shape.decode_context) == (2, 5, 53 + 12 + 13 + 14 + 15)
    assert shape.num_logits == 1 + 1 + 4


def test_roofline_by_hand():
    """Decode of one sequence on an 8B model is weight-bandwidth bound; a long prefill is compute bound."""
    arch = load_model_spec("llama-3.1-8b").arch
    device = load_device("h100-sxm")
    cost = RooflineCost(arch, 2, device)
    params = cost.linear_params + cost.head_params
    assert 7.4e9 < params < 8.1e9  # Llama-3.1-8B without its input embedding
    decode = StepShape(
        1,
        1,
        1,
        0,
        0,
        0.0,
        0,
        1,
        1,
        1000,
    )
    weights_s = params * 2 / device.bandwidth
    kv_s = arch.kv_bytes_per_token(2) * (1000 + 1) / device.bandwidth
    overhead = 1e-6 * (device.step_overhead_us + device.seq_overhead_us)
    assert cost.step_time(decode) == pytest.approx(weights_s + kv_s + overhead, rel=1e-9)
    n = 4096
    prefill = StepShape(1, n, 1, 1, n, n * (n + 1) / 2, n, 0, 0, 0)
    flops = 2 * cost.linear_params * n + 2 * cost.head_params + cost.attn_flops_per_pair * n * (n + 1) / 2
    assert cost.step_time(prefill) == pytest.approx(flops / device.flops, rel=0.02)


def test_devices_without_a_spec_sheet_or_unknown_are_refused():
    with pytest.raises(ValueError, match="no spec sheet"):
        load_device("cpu")
    with pytest.raises(ValueError, match="unknown device 'h900'.*h100-sxm"):
        load_device("h900")


def synthetic_shapes(n, seed=0):
    rng = random.Random(seed)
    shapes = []
    for _ in range(n):
        p_seqs, d_seqs = rng.randint(0, 3), rng.randint(0, 40)
        p_tok = sum(rng.randint(8, 300) for _ in range(p_seqs))
        pairs = p_tok * rng.uniform(10, 600)
        shapes.append(
            StepShape(
                p_seqs + d_seqs,
                p_tok + d_seqs,
                p_seqs + d_seqs,
                p_seqs,
                p_tok,
                pairs,
                p_tok,
                d_seqs,
                d_seqs,
                d_seqs * rng.randint(16, 900),
            )
        )
    return shapes


def test_profile_fit_recovers_a_planted_model(tmp_path):
    truth = {"step": 2e-3, "seqs": 5e-5, "linear": 1e-4, "logits": 2e-5, "prefill_pairs": 3e-9, "decode_context": 4e-8}
    knee = 32.0
    shapes = synthetic_shapes(400)
    rng = random.Random(1)

    def true_time(s):
        return (
            truth["step"]
            + truth["seqs"] * s.num_seqs
            + truth["linear"] * max(knee, s.num_tokens)
            + truth["logits"] * s.num_logits
            + truth["prefill_pairs"] * s.prefill_pairs
            + truth["decode_context"] * s.decode_context
        )

    seconds = [true_time(s) * rng.uniform(0.98, 1.02) for s in shapes]  # 2% noise
    result = fit(shapes, seconds, BENT_CURVE)  # a curve these steps do not follow: the knee form fits better
    assert result["linear_form"] == "knee" and result["fit"]["median_abs_rel_err"] < 0.02
    cost = written_profile(tmp_path, result)
    errors = [abs(cost.step_time(s) - true_time(s)) / true_time(s) for s in synthetic_shapes(100, seed=5)]
    assert max(errors) < 0.05


# one layer's linear-layer seconds at x rows, bent as on the VM of 2026-12-04: per row 2.2x dearer past 64 rows
BENT_CURVE = {"layers": 30, "x": [1.0, 16.0, 64.0, 256.0, 512.0], "seconds": [2.4e-4, 5.3e-4, 1.7e-3, 1.56e-2, 3.1e-2]}


def written_profile(tmp_path, result) -> ProfileCost:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"format": 1, "model": "m", "kernel": "k", "dtype": "float32", **result}))
    return ProfileCost(path, "m", "k", "float32")


def test_profile_fit_takes_the_measured_linear_curve_where_steps_follow_it(tmp_path):
    scale, other = 1.05, {"step": 2e-3, "seqs": 5e-5, "logits": 2e-5, "prefill_pairs": 3e-9, "decode_context": 4e-8}
    layers = BENT_CURVE["layers"]

    def true_time(s):
        return (
            other["step"]
            + other["seqs"] * s.num_seqs
            + scale * layers * interpolate(BENT_CURVE, s.num_tokens)
            + other["logits"] * s.num_logits
            + other["prefill_pairs"] * s.prefill_pairs
            + other["decode_context"] * s.decode_context
        )

    shapes, rng = synthetic_shapes(400), random.Random(2)
    seconds = [true_time(s) * rng.uniform(0.98, 1.02) for s in shapes]
    knee_only = fit(shapes, seconds)
    result = fit(shapes, seconds, BENT_CURVE)
    assert knee_only["linear_form"] == "knee" and result["linear_form"] == "curve"
    assert result["coefficients"]["linear"] == pytest.approx(scale, rel=0.03)
    forms = result["fit"]["forms_median_abs_rel_err"]
    assert forms["curve"] < 0.02 < forms["knee"] == pytest.approx(knee_only["fit"]["median_abs_rel_err"])
    cost = written_profile(tmp_path, result)
    assert cost.identity["profile_linear_form"] == "curve"
    held_out = synthetic_shapes(100, seed=5)
    assert max(abs(cost.step_time(s) - true_time(s)) / true_time(s) for s in held_out) < 0.05
    forced = fit(shapes, seconds, BENT_CURVE, linear_form="knee")
    assert forced["linear_form"] == "knee" and "linear_curve" not in forced
    with pytest.raises(ValueError, match="needs the calibration's linear-layer curve"):
        fit(shapes, seconds, linear_form="curve")
    with pytest.raises(ValueError, match="linear_form must be"):
        fit(shapes, seconds, BENT_CURVE, linear_form="bent")
    broken = {k: v for k, v in result.items() if k != "linear_curve"}
    with pytest.raises(ValueError, match="without its linear_curve"):
        written_profile(tmp_path, broken)


def test_profile_refuses_another_setup(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "format": 1,
                "model": "smollm2-135m",
                "kernel": "cpu",
                "dtype": "float32",
                "knee_tokens": 1.0,
                "coefficients": dict.fromkeys(FEATURES, 1e-3),
            }
        )
    )
    ProfileCost(path, "smollm2-135m", "cpu", "float32")
    with pytest.raises(ValueError, match="kernel 'cpu' \\(this run: 'torch'\\)"):
        ProfileCost(path, "smollm2-135m", "torch", "float32")
    with pytest.raises(ValueError, match="model 'smollm2-135m' \\(this run: 'tiny'\\)"):
        ProfileCost(path, "tiny", "cpu", "float32")
    ranged = json.loads(path.read_text()) | {"calibrated_range": {"max_seqs": 64, "max_tokens": 512}}
    path.write_text(json.dumps(ranged))
    ProfileCost(path, "smollm2-135m", "cpu", "float32", max_num_seqs=64, max_num_batched_tokens=512)
    with pytest.raises(ValueError, match="max_num_seqs=256 \\(calibrated up to 64\\)"):
        ProfileCost(path, "smollm2-135m", "cpu", "float32", max_num_seqs=256, max_num_batched_tokens=512)
    ProfileCost(path, "smollm2-135m", "cpu", "float32", 256, 512, allow_extrapolation=True)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a profile"):
        ProfileCost(tmp_path / "bad.json", "tiny", "cpu", "float32")
    with pytest.raises(ValueError, match="no profile at"):
        ProfileCost(tmp_path / "missing.json", "tiny", "cpu", "float32")


def test_clocks():
    v = VirtualClock()
    v.advance(0.5)
    v.sleep(0.25)
    assert v() == 0.75
    with pytest.raises(ValueError):
        v.advance(-1)
    rec = RecordingClock(iter([1.0, 2.0, 3.0]).__next__)
    assert [rec(), rec()] == [1.0, 2.0] and rec.readings == [1.0, 2.0]
    replay = ReplayClock(rec.readings)
    replay.sleep(100)  # idle time is in the readings
    assert [replay(), replay()] == [1.0, 2.0] and replay.exhausted
    with pytest.raises(ClockDivergence):
        replay()
