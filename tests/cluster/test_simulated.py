"""Simulated clusters end to end: N engines on one virtual time line, through the cluster runner."""

import json

import pandas as pd
import pytest

from experiments.cluster.runner import run_cluster
from experiments.run.runner import run_trace

from .helpers import SIM, SMALL_TRACE, cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(tmp_path, name, *overrides, single=False):
    out = tmp_path / name
    (run_trace if single else run_cluster)(cfg(*overrides), out)
    return out


def load(run_dir):
    return json.loads((run_dir / "summary.json").read_text()), pd.read_parquet(run_dir / "requests.parquet")


@pytest.mark.parametrize("mode", ["offline", "open_loop", "closed_loop"])
def test_every_request_finishes_exactly_once_on_one_replica(tmp_path, mode):
    overrides = [*SIM, *SMALL_TRACE, f"replay={mode}", "cluster.replicas=3", "cluster.router=least_outstanding"]
    if mode == "closed_loop":
        overrides.append("replay.concurrency=6")
    summary, requests = load(run(tmp_path, mode, *overrides))
    assert len(requests) == 40 and requests["request_id"].is_unique
    assert (requests["finish_reason"] == "length").all()
    assert (requests["output_tokens"] == requests["target_output_tokens"]).all()
    assert requests["replica"].between(0, 2).all()
    assert summary["completed"] == 40 and sum(summary["replica_requests"]) == 40
    assert summary["replica_requests"] == [int((requests["replica"] == i).sum()) for i in range(3)]
    assert min(summary["replica_requests"]) > 0  # least_outstanding used every replica
    steps = pd.read_parquet(tmp_path / mode / "steps.parquet")
    assert set(steps["replica"]) == {0, 1, 2} and summary["num_steps"] == len(steps)
    # tokens computed per replica = prompts (no prefix sharing in this trace) + outputs of its requests
    for i in range(3):
        mine = requests[requests["replica"] == i]
        work = steps[steps["replica"] == i]
        computed = work["num_prefill_tokens"].sum() + work["num_decode_tokens"].sum()
        expected = (mine["prompt_tokens"] - mine["cached_tokens"]).sum() + (mine["output_tokens"] - 1).sum()
        assert computed == expected == summary["replica_tokens"][i]
    assert summary["executor"] == "sim" and summary["cluster_mode"] == "simulated"
    assert summary["sim_steps"] == len(steps)


def test_simulated_cluster_is_deterministic(tmp_path):
    overrides = [*SIM, *SMALL_TRACE, "replay=open_loop", "cluster.replicas=4", "cluster.router=power_of_two"]
    first, second = run(tmp_path, "a", *overrides), run(tmp_path, "b", *overrides)
    assert (first / "summary.json").read_bytes() == (second / "summary.json").read_bytes()
    assert pd.read_parquet(first / "requests.parquet").equals(pd.read_parquet(second / "requests.parquet"))
    other_seed = run(tmp_path, "c", *overrides, "seed=1")  # the router's draws follow the seed
    assert load(other_seed)[1]["replica"].tolist() != load(first)[1]["replica"].tolist()


SESSIONS = ["trace=sessions", "replay=sessions", "trace.num_sessions=6", "trace.session_rate=20", "trace.think_s=0.05"]


@pytest.mark.parametrize(
    "workload",
    [
        [*SMALL_TRACE, "replay=offline"],
        [*SMALL_TRACE, "replay=open_loop"],
        [*SMALL_TRACE, "replay=closed_loop", "replay.concurrency=5"],
        SESSIONS,
        [*SESSIONS, "replay.concurrency=2"],
    ],
    ids=["offline", "open_loop", "closed_loop", "sessions", "sessions-capped"],
)
def test_one_replica_cluster_times_requests_as_the_single_engine_replay(tmp_path, workload):
    """The event loop adds no time and changes no decision: one replica, driven by the same replay driver,
    reproduces the single-engine run, request by request and step by step."""
    overrides = [*SIM, *workload]
    single = run(tmp_path, "single", *overrides, single=True)
    cluster = run(tmp_path, "cluster", *overrides)
    one, many = load(single)[1], load(cluster)[1]
    pd.testing.assert_frame_equal(one, many.drop(columns="replica"))
    one_steps, many_steps = (pd.read_parquet(d / "steps.parquet") for d in (single, cluster))
    pd.testing.assert_frame_equal(one_steps, many_steps.drop(columns=["replica", "role"]))


def test_default_config_is_a_single_engine_run(tmp_path):
    summary = json.loads((run(tmp_path, "one", *SIM, *SMALL_TRACE, single=True) / "summary.json").read_text())
    assert "cluster_replicas" not in summary and "replica" not in pd.read_parquet(tmp_path / "one" / "requests.parquet")


def conversations(path, num=13, turns=6, block=64):
    """A Mooncake-format trace of `num` conversations: turn t resends the whole history (hash ids) plus
    two new blocks, turns interleaved across conversations (13 of them: round robin over 4 replicas then
    moves each conversation every turn)."""
    rows, next_id = [], 0
    history = {c: [] for c in range(num)}
    for t in range(turns):
        for c in range(num):
            history[c] = history[c] + [next_id, next_id + 1]
            next_id += 2
            ts = 1000 * t + 10 * c
            rows.append({"timestamp": ts, "input_length": block * len(history[c]), "output_length": 8,
                         "hash_ids": list(history[c])})  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_prefix_affinity_keeps_conversations_on_their_cache(tmp_path):
    """Turns of a conversation share their history's blocks: prefix affinity finds them in cache."""
    trace = conversations(tmp_path / "chat.jsonl")
    common = [*SIM, "trace=mooncake", f"trace.path={trace}", "trace.block_size=64", "replay=open_loop"]
    spread = load(run(tmp_path, "rr", *common, "cluster.replicas=4", "cluster.router=round_robin"))[0]
    affine = load(run(tmp_path, "pa", *common, "cluster.replicas=4", "cluster.router=prefix_affinity"))[0]
    single = load(run(tmp_path, "one", *common, single=True))[0]
    # every turn after the first hits its whole history on one engine: (t - 1) * 2 of 2t blocks
    assert single["prefix_hit_rate"] > 0.5
    assert affine["cluster_prefix_hit_rate"] > single["prefix_hit_rate"] - 0.02
    assert spread["cluster_prefix_hit_rate"] < single["prefix_hit_rate"] / 2
    assert affine["replica_request_cv"] < 0.5  # and the conversations are spread, not piled on one replica


@pytest.mark.parametrize("pd_split", [False, True])
def test_a_timed_out_cluster_run_aborts_what_is_in_flight_and_keeps_the_rest(tmp_path, pd_split):
    layout = ["cluster.prefill_replicas=1", "cluster.decode_replicas=2"] if pd_split else ["cluster.replicas=3"]
    overrides = [*SIM, *SMALL_TRACE, "trace.rate=2000", "replay=open_loop", "replay.max_duration_s=0.05", *layout]
    summary, requests = load(run(tmp_path, "cut", *overrides))
    assert summary["timed_out"] and 0 < summary["completed"] < 40
    assert requests["request_id"].is_unique and requests["finish_reason"].notna().all()
    aborted = requests[requests["finish_reason"] == "abort"]
    assert len(aborted) == 40 - summary["completed"]
    assert (aborted["output_tokens"] < aborted["target_output_tokens"]).all()
