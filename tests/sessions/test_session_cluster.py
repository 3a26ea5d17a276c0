"""Sessions through a simulated cluster, and the session-affine router."""

import pandas as pd
import pytest

from experiments.cluster.runner import run_cluster
from testbed.cluster.routers import ReplicaSnapshot, RouteRequest, get_router

from .test_sessions import cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(tmp_path, router):
    out = tmp_path / router
    summary = run_cluster(
        cfg("executor=sim", "device=h100-sxm", "trace=sessions", "replay=sessions", "trace.num_sessions=8",
            "trace.turns=4", "trace.think_s=0.2", "trace.session_rate=50", "cache.block_size=16",
            "cluster.replicas=4", f"cluster.router={router}"), out, quiet=True,
    )  # fmt: skip
    turns = pd.read_parquet(out / "turns.parquet")
    replicas = pd.read_parquet(out / "requests.parquet").set_index("request_id")["replica"]
    return summary, turns.join(replicas, on="request_id")


def test_session_affinity_keeps_a_conversation_on_one_replica_and_its_history_cached(tmp_path):
    sticky, turns = run(tmp_path, "session_affinity")
    assert turns.groupby("session_id")["replica"].nunique().eq(1).all()
    assert turns["replica"].nunique() == 4  # new sessions spread
    later = turns[turns["turn"] > 0]
    assert (later["cached_tokens"] >= (later["history_tokens"] - 1) // 16 * 16).all()
    spread, rr_turns = run(tmp_path, "round_robin")
    assert rr_turns.groupby("session_id")["replica"].nunique().gt(1).any()
    assert sticky["later_turn_prefix_hit_rate"] > spread["later_turn_prefix_hit_rate"]
    assert sticky["turns_sent"] == spread["turns_sent"] == 32


def test_router_follows_the_prompt_a_request_extends():
    router = get_router("session_affinity")
    views = [ReplicaSnapshot(i) for i in range(3)]
    first = router.route(RouteRequest("a0", 40, [1, 2]), views)
    views[first].outstanding = 5  # busy: a new session goes elsewhere, the continuation does not
    other = router.route(RouteRequest("b0", 40, [7, 8]), views)
    assert other != first
    assert router.route(RouteRequest("a1", 80, [1, 2, 3, 4]), views) == first
    assert router.route(RouteRequest("a2", 90, [1, 2, 3, 4, 5]), views) == first
    # a second request extending a turn that was already continued is a new session
    assert router.route(RouteRequest("a1b", 80, [1, 2, 9]), views) != first


def test_router_load_bound_moves_a_session_off_an_overloaded_replica():
    router = get_router("session_affinity", load_factor=1.0)
    views = [ReplicaSnapshot(i) for i in range(2)]
    home = router.route(RouteRequest("a0", 40, [1, 2]), views)
    views[home].outstanding = 10
    assert router.route(RouteRequest("a1", 80, [1, 2, 3]), views) != home
    with pytest.raises(ValueError, match="load_factor"):
        get_router("session_affinity", load_factor=0.5)
