"""Step skipping (testbed.sim.decode_runs) gives exactly what stepping one by one gives: the same
summary.json, the same per-request rows (times to the last bit) and the same step rows, on several traces,
policies and replay modes, with preemption and prefix caching; and it did skip (else the check is empty)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from experiments.results import load_run
from experiments.runner import run_trace
from testbed.sim.decode_runs import DecodeRuns

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
    skipped = []
    real_run = DecodeRuns.run
    monkeypatch.setattr(DecodeRuns, "run", lambda self, horizon: skipped.append(real_run(self, horizon)) or skipped[-1])
    s_step, r_step, st_step = run(tmp_path, "step", overrides + ["executor.skip_steps=false"])
    assert not skipped  # the switch turns it off
    s_skip, r_skip, st_skip = run(tmp_path, "skip", overrides)
    assert s_skip == s_step
    assert r_skip.equals(r_step)
    assert st_skip.equals(st_step)
    if case.endswith("mlfq"):
        assert sum(skipped) == 0
    else:  # under memory pressure requests mostly wait, and nothing is skipped while they do
        share = 0.01 if "preemption" in case or "swap" in case else 0.2
        assert sum(skipped) > share * len(st_skip), f"{case}: only {sum(skipped)} of {len(st_skip)} steps skipped"
    if "preemption" in case or "swap" in case:
        assert s_step["num_preemptions"] > 0 if "num_preemptions" in s_step else r_step["num_preemptions"].sum() > 0
    if case.endswith("prefix") or case == "sessions":
        assert r_step["cached_tokens"].sum() > 0


@pytest.mark.parametrize("router", ["least_outstanding", "least_kv"])
def test_cluster_skipping_equals_stepping(tmp_path, monkeypatch, router):
    """Three simulated replicas, open loop: the router reads each replica's state at every arrival, so
    a replica may only skip the steps that start before the next one; the same tables either way."""
    from experiments.cluster.runner import run_cluster

    skipped = []
    real_run = DecodeRuns.run
    monkeypatch.setattr(DecodeRuns, "run", lambda self, horizon: skipped.append(real_run(self, horizon)) or skipped[-1])
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
