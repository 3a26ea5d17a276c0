"""Per-replica horizons in the simulated cluster: a router that reads no replica state has the open loop's
whole schedule routed ahead, so each replica skips decode steps up to its own next arrival; one that reads
state keeps the cluster's next arrival as every replica's horizon. Either way the result is what stepping
one by one gives (same summary, per-request rows and step rows), on several routers and traces, with
preemption, prefix caching and a deadline; and the horizons did what they claim (fewer, longer runs)."""

import pytest

from experiments.cluster.runner import run_cluster
from experiments.results.files import load_run
from testbed import Engine, SamplingParams
from testbed.cluster.routers import ROUTERS, Router, router_class
from testbed.cluster.routers.round_robin import RoundRobinRouter
from testbed.cluster.simulated import SimulatedCluster
from testbed.config import EngineConfig
from testbed.sim.clock import VirtualClock
from testbed.sim.decode_runs import DecodeRuns

from .helpers import SIM, cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

AZURE = ["trace=azure", "trace.max_requests=80", "replay=open_loop", "cluster.replicas=4", "trace.time_scale=4"]
CASES = {
    "azure": AZURE,
    # a small cache on each replica: requests are preempted, runs stop where the free blocks run out
    "preemption": AZURE + ["trace.time_scale=24", "cache.num_blocks=400", "scheduler.max_num_seqs=64"],
    # shared system prompts: blocks filled during runs are registered in the prefix cache and hit later
    "prefix": [
        "trace=synthetic",
        "trace.num_requests=60",
        "trace.rate=30",
        "trace.prompt_len={dist:uniform,low:32,high:400}",
        "trace.output_len={dist:uniform,low:8,high:300}",
        "trace.prefix_groups=4",
        "trace.prefix_len=256",
        "replay=open_loop",
        "cluster.replicas=3",
        "cache.num_blocks=600",
    ],
    # the deadline falls mid-run: what is in flight then is aborted, and no replica may run past it
    "deadline": AZURE + ["replay.max_duration_s=4"],
}
PAIRS = [
    ("round_robin", "azure"),
    ("round_robin", "preemption"),
    ("round_robin", "deadline"),
    ("random", "prefix"),
    ("random", "deadline"),
    ("least_outstanding", "azure"),
    ("prefix_affinity", "prefix"),
    ("session_affinity", "preemption"),
]


def run(tmp_path, name, overrides):
    run_cluster(cfg("wandb.enabled=false", *SIM, *overrides), tmp_path / name)
    return load_run(tmp_path / name)


class Spy:
    """Counts Engine.step calls (full steps) and DecodeRuns.run calls with the steps each advanced."""

    def __init__(self, monkeypatch):
        self.engine_steps, self.runs = 0, []
        step, run = Engine.step, DecodeRuns.run

        def counted_step(engine, horizon=None):
            self.engine_steps += 1
            return step(engine, horizon)

        def counted_run(runs, horizon, *args, **kwargs):
            self.runs.append(run(runs, horizon, *args, **kwargs))
            return self.runs[-1]

        monkeypatch.setattr(Engine, "step", counted_step)
        monkeypatch.setattr(DecodeRuns, "run", counted_run)

    def reset(self) -> None:
        self.engine_steps, self.runs = 0, []


@pytest.mark.parametrize(("router", "case"), PAIRS)
def test_horizons_equal_stepping(tmp_path, monkeypatch, router, case):
    overrides = CASES[case] + [f"cluster.router={router}"]
    spy = Spy(monkeypatch)
    s_step, r_step, st_step = run(tmp_path, "step", overrides + ["executor.skip_steps=false"])
    assert not spy.runs and spy.engine_steps >= len(st_step)
    spy.reset()
    s_skip, r_skip, st_skip = run(tmp_path, "skip", overrides)
    assert s_skip == s_step
    assert r_skip.equals(r_step)
    assert st_skip.equals(st_step)
    # every step is an engine step's or a run's, and runs did skip steps (else the check is empty)
    assert spy.engine_steps + sum(spy.runs) >= len(st_skip)
    share = 0.01 if case == "preemption" else 0.3
    assert sum(spy.runs) > share * len(st_skip), f"{router}/{case}: {sum(spy.runs)} of {len(st_skip)} skipped"
    if case == "preemption":
        assert r_step["num_preemptions"].sum() > 0
    if case == "prefix":
        assert r_step["cached_tokens"].sum() > 0
    if case == "deadline":
        assert s_step["timed_out"] and (r_step["finish_reason"] == "abort").any()


@pytest.mark.parametrize("case", ["azure", "deadline"])
def test_routing_ahead_equals_the_global_horizon_in_fewer_runs(tmp_path, monkeypatch, case):
    """round_robin routed ahead (each replica to its own next arrival) against the same router declared
    state-reading (every replica to the cluster's next arrival): the same tables, from far fewer and
    longer runs of decode steps."""
    overrides = CASES[case] + ["cluster.router=round_robin"]
    spy = Spy(monkeypatch)
    ahead = run(tmp_path, "ahead", overrides)
    ahead_runs = [n for n in spy.runs if n]
    monkeypatch.setattr(RoundRobinRouter, "reads_replica_state", True)
    spy.reset()
    everywhere = run(tmp_path, "global", overrides)
    global_runs = [n for n in spy.runs if n]
    assert ahead[0] == everywhere[0]
    assert ahead[1].equals(everywhere[1])
    assert ahead[2].equals(everywhere[2])
    assert sum(ahead_runs) == sum(global_runs) > 0  # the same steps skipped, in fewer runs
    assert len(ahead_runs) < 0.6 * len(global_runs), f"{len(ahead_runs)} runs routed ahead, {len(global_runs)} not"


def test_routers_declare_whether_they_read_replica_state():
    state_free = {name for name in ROUTERS if not router_class(name).reads_replica_state}
    assert state_free == {"round_robin", "random"}

    class Undeclared(RoundRobinRouter):  # may read more than its parent: taken to read state
        pass

    class Declared(Router):
        reads_replica_state = False

    assert Undeclared.reads_replica_state and not Declared.reads_replica_state


def small_cluster(router: Router, replicas: int = 2) -> SimulatedCluster:
    config = EngineConfig(model="llama-3.1-8b", executor="sim", sim_config={"device": "h100-sxm"})
    return SimulatedCluster([Engine(config, clock=VirtualClock()) for _ in range(replicas)], router)


def test_plan_arrivals_routes_ahead_and_holds_the_caller_to_it():
    cluster = small_cluster(RoundRobinRouter())
    prompt, params = list(range(40)), SamplingParams(max_tokens=8, ignore_eos=True)
    plan = [("a", prompt, 0.0), ("b", prompt, 0.5), ("c", prompt, 0.5)]
    assert cluster.plan_arrivals(plan)
    assert [list(r.planned) for r in cluster.replicas] == [[0.0, 0.5], [0.5]]  # in turn, as at each arrival
    with pytest.raises(ValueError, match="not the next planned"):
        cluster.submit("x", prompt, params)
    assert cluster.submit("a", prompt, params) == 0
    assert cluster.horizon(cluster.replicas[0]) == 0.5  # its next arrival ("c")
    with pytest.raises(ValueError, match="came early"):
        cluster.submit("b", prompt, params)
    while cluster.now < 0.5:
        cluster.run_until(0.5, quiet_until=0.5)
    with pytest.raises(ValueError, match="not the next planned"):
        cluster.submit("c", prompt, params)  # "b" comes first
    assert cluster.submit("b", prompt, params) == 1 and cluster.submit("c", prompt, params) == 0
    with pytest.raises(ValueError, match="back in time"):
        cluster.plan_arrivals([("d", prompt, 2.0), ("e", prompt, 1.0)])


def test_a_state_reading_router_is_not_routed_ahead():
    cluster = small_cluster(router_class("least_outstanding")())
    assert not cluster.plan_arrivals([("a", list(range(40)), 0.0)])
    assert cluster.horizon(cluster.replicas[0]) is None  # the caller's quiet_until, none given yet
