"""experiments.calibration.calibrate's workloads hold lone prefills (one request at a time) across the prompt
lengths the held-out workloads send, so the fitted steps include the step a request's TTFT is at
concurrency 1; a real --quick calibration of the tiny model records them as steps of one prefill each."""

import json
from collections import Counter

import pytest

import experiments.calibration.calibrate as calibrate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_plan_submits_lone_prefills_one_at_a_time_across_the_prompt_lengths():
    plan = calibrate.workloads(2048, quick=False)
    lone = [w for w in plan if w.sequential]
    assert [w.name for w in lone] == ["lone prefills"]
    counts = Counter(p for p, _ in lone[0].lengths)
    assert set(counts) == {16, 32, 64, 96, 128, 160, 192, 256, 384, 768}
    assert min(counts.values()) >= 3
    assert {o for _, o in lone[0].lengths} == {1}  # its prefill is the request's only step
    (short,) = [w for w in calibrate.workloads(256, quick=False) if w.sequential]
    assert max(p + o for p, o in short.lengths) == 255  # sized to the context


def test_a_quick_calibration_fits_lone_prefill_steps_at_several_lengths(tmp_path):
    args = ["model=tiny", "kernel=torch", "cache.memory_gb=0.0625", "--quick", "--no-operators"]
    path = calibrate.main([*args, "--warmup", "1", "--probe-repeats", "1", "--force", "--out", str(tmp_path)])
    profile = json.loads(path.read_text())
    samples = profile["samples"]
    fields = samples["features"]
    steps = [dict(zip(fields, s)) for s in samples["shapes"]]
    assert profile["fit"]["samples"] == len(steps) == len(samples["workload"])
    lone = [s for s, w in zip(steps, samples["workload"]) if w == "lone prefills"]
    (workload,) = [w for w in calibrate.workloads(2048, quick=True) if w.sequential]  # tiny: 128k context
    assert len(lone) == len(workload.lengths) - 1  # one step per prompt; the workload's last is not timed
    assert all(s["num_seqs"] == s["prefill_seqs"] == 1 and s["decode_seqs"] == 0 for s in lone)
    assert {s["prefill_tokens"] for s in lone} == {p for p, _ in workload.lengths}
    batched = [s for s, w in zip(steps, samples["workload"]) if w == "prefill"]
    assert max(s["prefill_seqs"] for s in batched) > 1  # the "prefill" workload alone would batch them
