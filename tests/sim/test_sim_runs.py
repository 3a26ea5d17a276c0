"""The simulated executor end to end: the real scheduler on a virtual clock, through the runner."""

import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from experiments.run.runner import run_trace
from testbed import Engine, SamplingParams
from testbed.config import EngineConfig
from testbed.sim.clock import ClockDivergence

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL_TRACE = [
    "trace=synthetic",
    "trace.num_requests=24",
    "trace.rate=2000",  # a burst: preemption happens however fast the machine
    "trace.prompt_len={dist:uniform,low:8,high:48}",
    "trace.output_len={dist:uniform,low:2,high:16}",
]


def cfg(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=["progress=false", *overrides])


def run(tmp_path, name, *overrides):
    out = tmp_path / name
    run_trace(cfg(*overrides), out)
    return out


def batches(run_dir):
    steps = pd.read_parquet(run_dir / "steps.parquet")
    return steps[["num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_preempted"]].values.tolist()


def test_replay_steps_reproduces_a_real_run_exactly(tmp_path):
    """A real open-loop run, then a simulation of the same trace and config replaying its recorded clock:
    every step schedules the same batch (checked as it runs) and every request's times come out equal."""
    common = [
        "model=tiny",
        "cache.num_blocks=60",
        "cache.block_size=4",
        "scheduler.max_num_seqs=6",
        "replay=open_loop",
        *SMALL_TRACE,
    ]
    real = run(tmp_path, "real", *common)
    assert (real / "clock.parquet").exists()
    real_summary = json.loads((real / "summary.json").read_text())
    assert real_summary["executor"] == "real" and real_summary["kernel"] in ("cpu", "torch")  # auto, resolved
    sim = run(tmp_path, "sim", *common, "executor=sim", "executor.cost_model=replay_steps", f"executor.run={real}")
    a = pd.read_parquet(real / "requests.parquet").set_index("request_id").sort_index()
    b = pd.read_parquet(sim / "requests.parquet").set_index("request_id").sort_index()
    for column in ("arrival_time", "first_token_time", "finish_time", "output_tokens", "num_preemptions"):
        assert (a[column] == b[column]).all(), column
    assert batches(real) == batches(sim)
    assert sum(row[3] for row in batches(real)) > 0, "want preemptions exercised"
    summary = json.loads((sim / "summary.json").read_text())
    assert summary["executor"] == "sim" and summary["sim_cost_model"] == "replay_steps"
    with pytest.raises(ClockDivergence):  # another config makes other decisions: caught, not averaged away
        run(
            tmp_path,
            "other",
            *common[: -len(SMALL_TRACE)],
            "scheduler.max_num_seqs=3",
            *SMALL_TRACE[1:],
            "trace=synthetic",
            "executor=sim",
            "executor.cost_model=replay_steps",
            f"executor.run={real}",
        )


def test_simulation_schedules_like_the_real_engine(tmp_path):
    """Offline FCFS does not depend on time: the simulated and the real engine schedule identically."""
    common = [
        "model=tiny",
        "cache.num_blocks=50",
        "cache.block_size=4",
        "scheduler.max_num_batched_tokens=32",
        *SMALL_TRACE,
    ]
    real = run(tmp_path, "real", *common)
    sim = run(tmp_path, "sim", *common, "executor=sim", "device=h100-sxm", "dtype=float32")
    assert batches(real) == batches(sim)


@pytest.mark.parametrize("mode", ["offline", "open_loop", "closed_loop"])
def test_every_replay_mode_on_the_virtual_clock_is_deterministic(tmp_path, mode):
    overrides = ["model=llama-3.1-8b", "executor=sim", "device=h100-sxm", f"replay={mode}", *SMALL_TRACE]
    if mode == "closed_loop":
        overrides.append("replay.concurrency=4")
    first, second = run(tmp_path, "a", *overrides), run(tmp_path, "b", *overrides)
    for name in ("requests.parquet", "steps.parquet", "summary.json", "config.yaml", "trace_report.json"):
        assert (first / name).exists()
    assert (first / "summary.json").read_bytes() == (second / "summary.json").read_bytes()
    summary = json.loads((first / "summary.json").read_text())
    assert summary["completed"] == 24 and summary["executor"] == "sim"
    assert summary["sim_cost_model"] == "roofline" and summary["sim_device"] == "h100-sxm"
    assert summary["sim_simulated_seconds"] > 0 and not (first / "clock.parquet").exists()
    requests = pd.read_parquet(first / "requests.parquet")
    assert (requests["output_tokens"] == requests["max_tokens"]).all() if "max_tokens" in requests else True
    if mode == "open_loop":  # arrivals on the virtual clock are the trace's
        assert summary["duration"] >= requests["arrival_time"].max() - requests["arrival_time"].min()


@pytest.mark.parametrize("skip_steps", [True, False])
def test_cost_scale_multiplies_every_step_price(tmp_path, skip_steps):
    """A device 2x slower (executor.cost_scale=2): a closed loop's every time doubles, decode TPOT included,
    through the decode runs' batched prices too (skip_steps) and stepping one by one."""
    overrides = [
        "model=llama-3.1-8b",
        "executor=sim",
        "device=h100-sxm",
        "replay=closed_loop",
        "replay.concurrency=4",
        f"executor.skip_steps={str(skip_steps).lower()}",
        *SMALL_TRACE,
        "trace.output_len={dist:uniform,low:48,high:64}",  # decode-bound
    ]
    base = json.loads((run(tmp_path, "x1", *overrides) / "summary.json").read_text())
    slow = json.loads((run(tmp_path, "x2", *overrides, "executor.cost_scale=2") / "summary.json").read_text())
    assert base["num_steps"] == slow["num_steps"] and base["decode_tokens"] > 10 * base["prefill_tokens"] / 48
    for key in ("median_tpot_ms", "p99_tpot_ms", "median_ttft_ms", "median_e2el_ms", "duration"):
        assert slow[key] == pytest.approx(2 * base[key], rel=1e-9), key
    assert slow["sim_cost_scale"] == 2 and "sim_cost_scale" not in base


def test_simulated_speculative_decoding_accepts_at_the_configured_rate():
    engine = Engine(
        EngineConfig(
            model="llama-3.1-8b",
            executor="sim",
            sim_config={"device": "h100-sxm", "spec_acceptance": 0.6},
            speculative_config={"method": "ngram", "num_speculative_tokens": 4},
            num_blocks=4000,
        )
    )
    for i in range(16):
        engine.add_request(str(i), list(range(100, 140)), SamplingParams(max_tokens=200, ignore_eos=True))
    lengths = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                lengths[out.request_id] = len(out.outputs[0].token_ids)
    assert set(lengths.values()) == {200}
    stats = engine.spec_stats
    # i.i.d. acceptance (Leviathan et al.): the first draft is accepted with probability 0.6, and a
    # verification of k = 4 drafts emits (1 - 0.6**5) / (1 - 0.6) = 2.31 tokens on average
    assert stats["per_position_acceptance_rate"][0] == pytest.approx(0.6, abs=0.05)
    assert stats["mean_accepted_length"] == pytest.approx((1 - 0.6**5) / 0.4, rel=0.08)
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


@pytest.mark.parametrize(
    "sim_config, match",
    [
        ({"cost_model": "roofline", "device": "h900"}, "unknown device 'h900'"),
        ({"cost_model": "roofline", "device": "cpu"}, "no spec sheet"),
        ({"cost_model": "roofline"}, "needs a device"),
        ({"cost_model": "profile", "profile": "/nonexistent.json"}, "no profile at"),
        ({"cost_model": "replay_steps", "run": "/nonexistent"}, "not a recorded run"),
        ({"cost_model": "magic"}, r"unknown sim cost_model .magic.; choose one of \[.roofline., .profile."),
        ({"device": "h100-sxm", "cost_scale": 0.0}, r"executor\.cost_scale must be a finite number > 0"),
        ({"cost_model": "replay_steps", "run": "/x", "cost_scale": 2.0}, "replay_steps replays recorded time"),
    ],
)
def test_bad_simulation_config_fails_before_the_run(sim_config, match):
    with pytest.raises(ValueError, match=match):
        Engine(EngineConfig(model="tiny", executor="sim", sim_config=sim_config))
