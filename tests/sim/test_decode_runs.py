"""Step skipping (testbed.sim.decode_runs) gives exactly what stepping one by one gives: the same
summary.json, the same per-request rows (times to the last bit), the same step rows and the same
block-access stream, on several traces, policies and replay modes, with preemption and prefix caching;
and it did skip (else the check is empty). A run's steps recorded whole (columns) equal their rows, and
the cost model's price of a whole run equals its price step by step."""

from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

import experiments.run.runner
from experiments.kv_whatif.stream import FILE as ACCESS_FILE
from experiments.results.files import load_run
from experiments.results.recorder import Recorder
from experiments.run.runner import build_engine, run_trace
from testbed.core.allocators.paged import PagedAllocator
from testbed.engine import Engine
from testbed.sampling_params import SamplingParams
from testbed.sim.cost_models.scaled import ScaledCost
from testbed.sim.decode_runs import DecodeRuns
from testbed.sim.shape import StepShape

ROOT = Path(__file__).resolve().parents[2]
SIM = ["executor=sim", "device=h100-sxm", "model=llama-3.1-8b", "progress=false", "wandb.enabled=false"]
AZURE = ["trace=azure", "trace.max_requests=80"]
PREFIX = [  # 4 shared system prompts of 256 tokens
    "trace=synthetic",
    "trace.num_requests=60",
    "trace.rate=8",
    "trace.prompt_len={dist:uniform,low:32,high:400}",
    "trace.output_len={dist:uniform,low:8,high:300}",
    "trace.prefix_groups=4",
    "trace.prefix_len=256",
]

CASES = {
    "azure-fcfs-open": AZURE + ["replay=open_loop"],
    "azure-sjf-closed": AZURE + ["replay=closed_loop", "replay.concurrency=24", "scheduler=sjf"],
    # offline and open loop send by the clock alone: a run goes on after a step in which requests finished
    "azure-fcfs-offline": AZURE + ["replay=offline", "scheduler.max_num_seqs=48"],
    # a small cache: requests are preempted (recompute) and runs stop where the free blocks run out
    "azure-preemption": AZURE
    + ["replay=open_loop", "trace.time_scale=8", "cache.num_blocks=400", "scheduler.max_num_seqs=64"],
    # shared prefixes: blocks filled during a run are registered in the prefix cache, evicted and hit later
    "synthetic-prefix": PREFIX + ["replay=open_loop", "cache.num_blocks=600"],
    # the host KV tier: device evictions copied to host memory, priced in the step that makes them
    "host-tier": AZURE
    + [
        "replay=open_loop",
        "cache.num_blocks=1500",
        "cache.host_tier_blocks=4000",
        "cache.host_tier_link={name:slow,bandwidth_gbs:0.1,latency_us:100}",
    ],
    # short prompts, long outputs, all admitted at once: decode runs stop where the free blocks run out
    "synthetic-out-of-blocks": [
        "trace=synthetic",
        "trace.num_requests=20",
        "trace.prompt_len={dist:uniform,low:20,high:60}",
        "trace.output_len={dist:uniform,low:200,high:400}",
        "replay=offline",
        "cache.num_blocks=200",
    ],
    # outputs of nearly one length, small blocks: several requests finish in one step, often taking a block
    # in it, and runs that take such steps stop where the free blocks run out
    "synthetic-same-step-finishes": [
        "trace=synthetic",
        "trace.num_requests=24",
        "trace.prompt_len={dist:uniform,low:20,high:60}",
        "trace.output_len={dist:uniform,low:60,high:64}",
        "replay=offline",
        "cache.block_size=4",
        "cache.num_blocks=320",
    ],
    # prompts of 2-4 tokens from two ids: many requests have the same prompt (and hit its first block), so
    # their decode blocks get the same hashes; runs register them while evicting cached free blocks
    "synthetic-same-prompts": [
        "trace=synthetic",
        "trace.num_requests=40",
        "trace.rate=6",
        "trace.prompt_len={dist:uniform,low:2,high:4}",
        "trace.token_low=128254",
        "trace.output_len={dist:uniform,low:40,high:160}",
        "replay=open_loop",
        "cache.block_size=2",
        "cache.num_blocks=500",
    ],
    # no prefix caching: a run's only allocations are new blocks
    "synthetic-no-caching": PREFIX + ["replay=open_loop", "cache.num_blocks=600", "cache.prefix_caching=false"],
    # another eviction order and block size, shared prefixes
    "synthetic-lfu-b8-prefix": PREFIX
    + ["replay=open_loop", "cache.num_blocks=1200", "cache.block_size=8", "cache.eviction=lfu"],
    # every price scaled (executor.cost_scale: a wrapper around the cost model's run prices)
    "azure-cost-scale": AZURE + ["replay=open_loop", "executor.cost_scale=1.37"],
    # multi-turn sessions: later turns are sent at times the driver knows (its horizon) and hit the cache
    "sessions": ["trace=sessions", "replay=sessions", "trace.num_sessions=12", "trace.session_rate=2"],
}
SLOW_CASES = {
    "azure-priority-offline": AZURE + ["replay=offline", "scheduler=priority", "scheduler.max_num_seqs=32"],
    "azure-swap": AZURE
    + ["replay=open_loop", "trace.time_scale=8", "cache.num_blocks=400", "cache.preemption_mode=swap"],
    "azure-mlfq": AZURE + ["replay=open_loop", "scheduler=mlfq"],  # time-dependent: never skips
}


def run(tmp_path: Path, name: str, overrides: list[str]):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=SIM + overrides)
    run_trace(cfg, tmp_path / name)
    return load_run(tmp_path / name)


@pytest.mark.parametrize("case", sorted(CASES) + [pytest.param(c, marks=pytest.mark.slow) for c in sorted(SLOW_CASES)])
def test_skipping_equals_stepping(tmp_path, monkeypatch, case):
    overrides = {**CASES, **SLOW_CASES}[case]
    skipped, planned, runners, finishes = [], [], [], []
    real_run, real_planned = DecodeRuns.run, DecodeRuns._run_planned

    def counted(self, horizon, ended=None, past_finishes=True):
        runners.append(self)
        before = self.num_finishing
        skipped.append(real_run(self, horizon, ended, past_finishes))
        finishes.append(self.num_finishing - before)  # steps in which requests finished, in this call
        return skipped[-1]

    monkeypatch.setattr(DecodeRuns, "run", counted)
    blocks, priced = [], [0]  # azure-cost-scale: per planned run, the blocks of steps it priced; all priced

    def plan(self, *args):
        if case == "azure-cost-scale":
            self._last_price *= 16  # first blocks of a few steps: runs priced in several blocks
        before = priced[0]
        planned.append(real_planned(self, *args))
        blocks.append(priced[0] - before)
        return planned[-1]

    monkeypatch.setattr(DecodeRuns, "_run_planned", plan)
    real_prices = ScaledCost.decode_step_times

    def prices(self, *args):
        priced[0] += 1
        return real_prices(self, *args)

    monkeypatch.setattr(ScaledCost, "decode_step_times", prices)
    ending_runs = []  # runs whose last step ended requests (recorded whole, not as a full step)
    real_emit_run = Engine._emit_run

    def emit_run(self, starts, ends, kv, ids, num_finished):
        ending_runs.append(num_finished > 0)
        real_emit_run(self, starts, ends, kv, ids, num_finished)

    monkeypatch.setattr(Engine, "_emit_run", emit_run)
    collided, evicted = [], []  # per planned run: hashes it registered that cached blocks had; blocks it evicted
    if case == "synthetic-same-prompts":
        real_slots = PagedAllocator.decode_slots

        def slots(self, requests, first_ends, takes, registers, per_step):
            mapped, counts = set(self.pool.hash_to_block), [len(r.block_hashes) for r in requests]
            evictions = self.pool.num_evictions
            noted = real_slots(self, requests, first_ends, takes, registers, per_step)
            collided.append(sum(h in mapped for r, k in zip(requests, counts) for h in r.block_hashes[k:]))
            evicted.append(self.pool.num_evictions - evictions)
            return noted

        monkeypatch.setattr(PagedAllocator, "decode_slots", slots)
    s_step, r_step, st_step = run(tmp_path, "step", overrides + ["executor.skip_steps=false"])
    assert not skipped  # the switch turns it off
    s_skip, r_skip, st_skip = run(tmp_path, "skip", overrides)
    assert s_skip == s_step
    assert r_skip.equals(r_step)
    assert st_skip.equals(st_step)
    accesses = [pd.read_parquet(tmp_path / name / ACCESS_FILE) for name in ("step", "skip")]
    assert len(accesses[0]) > 0 and accesses[1].equals(accesses[0])
    if case.endswith("mlfq"):
        assert sum(skipped) == 0
    else:  # under memory pressure requests mostly wait, and nothing is skipped while they do
        share = 0.01 if "preemption" in case or "swap" in case else 0.2
        assert sum(skipped) > share * len(st_skip), f"{case}: only {sum(skipped)} of {len(st_skip)} steps skipped"
    # the runs were planned ahead (_run_planned), except with host-tier copies (priced per step)
    if case == "host-tier":
        assert not planned
    elif not case.endswith("mlfq"):
        assert sum(p or 0 for p in planned) == sum(skipped)
    if case in ("synthetic-out-of-blocks", "synthetic-same-step-finishes"):
        assert sum(r.num_out_of_blocks for r in set(runners)) > 0
    # planned runs take the steps in which requests finish: sending by the clock alone (open loop,
    # offline), runs go on past them; a driver that may send on a finish (closed loop, sessions) gets it
    # when the step ends, the run ending with it
    finishing = sum(r.num_finishing for r in set(runners))
    assert sum(ending_runs) == finishing
    if case not in ("host-tier", "azure-mlfq"):
        assert finishing > 0
        assert max(finishes) == 1 if case.endswith("closed") or case == "sessions" else max(finishes) > 1
    if case == "synthetic-same-step-finishes":  # pure decode steps in which several requests finished
        decode = st_step[(st_step["num_prefill_tokens"] == 0) & (st_step["num_waiting"] == 0)]
        assert (decode["num_seqs"] - decode["num_running"] >= 2).any()
    if "preemption" in case or "swap" in case or "out-of-blocks" in case:
        assert s_step["num_preemptions"] > 0 if "num_preemptions" in s_step else r_step["num_preemptions"].sum() > 0
    if case.endswith("prefix") or case == "sessions":
        assert r_step["cached_tokens"].sum() > 0
    if case == "azure-cost-scale":  # runs of several blocks
        assert sum(b > 1 for b, p in zip(blocks, planned) if p) > 0.5 * sum(map(bool, planned))
    if case == "synthetic-same-prompts":  # runs evicted cached blocks and registered hashes cached blocks had
        assert sum(evicted) > 0 and sum(collided) > 0 and r_step["cached_tokens"].sum() > 0


@pytest.mark.parametrize("router", ["least_outstanding", "least_kv"])
def test_cluster_skipping_equals_stepping(tmp_path, monkeypatch, router):
    """Three simulated replicas, open loop: the router reads each replica's state at every arrival, so
    a replica may only skip the steps that start before the next one; the same tables either way."""
    from experiments.cluster.runner import run_cluster

    skipped, runners = [], set()
    real_run = DecodeRuns.run

    def counted(self, horizon, *args, **kwargs):
        runners.add(self)
        skipped.append(real_run(self, horizon, *args, **kwargs))
        return skipped[-1]

    monkeypatch.setattr(DecodeRuns, "run", counted)
    cluster = AZURE + ["replay=open_loop", "trace.time_scale=3", "cluster.replicas=3", f"cluster.router={router}"]
    tables = []
    for name, skip in (("step", "false"), ("skip", "true")):
        with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
            cfg = compose("config", overrides=SIM + cluster + [f"executor.skip_steps={skip}"])
        run_cluster(cfg, tmp_path / name)
        tables.append(load_run(tmp_path / name))
    (s_step, r_step, st_step), (s_skip, r_skip, st_skip) = tables
    assert s_skip == s_step
    assert r_skip.equals(r_step)
    assert st_skip.equals(st_step)
    assert sum(skipped) > 0.2 * len(st_skip)
    assert sum(r.num_finishing for r in runners) > 0  # runs that ended with a step in which requests finished


@pytest.mark.parametrize("listening", [False, True])
def test_runs_recorded_whole_equal_their_rows(tmp_path, monkeypatch, listening):
    """The recorder keeps decode runs whole and makes the steps table from columns; the rows it makes
    when read (Recorder.steps), and those a step listener gets one by one, are the same table."""
    recorders, heard = [], []

    class Kept(Recorder):
        def __init__(self):
            super().__init__()
            recorders.append(self)
            if listening:
                self.listeners.append(heard.append)

    monkeypatch.setattr(experiments.run.runner, "Recorder", Kept)
    run(tmp_path, "run", CASES["synthetic-prefix"])
    (recorder,) = recorders
    assert bool(recorder._runs) is not listening  # a listener takes rows: runs are then made row by row
    columns = recorder.steps_frame()
    rows = pd.DataFrame(recorder.steps)
    assert not recorder._runs and len(rows) > 0
    assert columns.equals(rows)
    if listening:
        assert pd.DataFrame(heard).equals(rows)


@pytest.mark.parametrize("extra", [[], ["parallel.tensor_parallel_size=2"]])
def test_run_prices_equal_step_prices(extra):
    """CostModel.decode_step_times (the roofline's in Python for a few steps, vectorised for more; tensor
    parallelism's step by step) gives step_time's doubles exactly, also past the range where the
    vectorised products are exact."""
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=SIM + ["trace=synthetic", *extra])
    cost = build_engine(cfg, record_clock=False).executor.cost_model
    cases = [(1, 17, 3), (1, 17, 40), (7, 7 * 300, 100), (256, 256 * 2000, 64), (64, 2**45, 8), (64, 2**45, 40)]
    cases += [(9, 9 * 500, 12), (256, 256 * 2000, 24), (7, 7 * 300, 25), (3, 5, 1)]  # around _FEW_STEPS
    for n, first, count in cases:
        expected = [cost.step_time(StepShape(n, n, n, 0, 0, 0.0, 0, n, n, first + i * n)) for i in range(count)]
        assert cost.decode_step_times(n, first, count) == expected


def test_last_stats_after_a_run_equal_the_step_alone():
    """Engine.last_stats after a step that advanced a decode run (the run's last StepStats, made when
    read) equals that of the same step taken alone, run after run."""
    engines = []
    for skip in ("true", "false"):
        with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
            cfg = compose("config", overrides=SIM + ["trace=synthetic", f"executor.skip_steps={skip}"])
        engine = build_engine(cfg, record_clock=False)
        for k in range(4):
            engine.add_request(f"r{k}", [5 + k] * (30 + 7 * k), SamplingParams(max_tokens=40 + 9 * k), arrival_time=0.0)
        engines.append(engine)
    skipping, stepping = engines
    runs = 0
    while skipping.has_unfinished():
        before = skipping.step_count
        skipping.step(horizon=skipping.clock() + 0.05, sends_on_finish=False)
        runs += skipping.step_count > before + 1
        while stepping.step_count < skipping.step_count:
            stepping.step()
        assert stepping.step_count == skipping.step_count
        assert skipping.last_stats == stepping.last_stats
    assert runs > 1 and not stepping.has_unfinished()
