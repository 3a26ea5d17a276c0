"""Disaggregated prefill/decode on the simulated cluster: conservation, KV handoff, back-pressure, timing."""

import json

import pandas as pd
import pytest

from experiments.cluster.runner import run_cluster
from testbed import Engine, SamplingParams
from testbed.cluster.disaggregated import DisaggregatedCluster
from testbed.cluster.links import LinkSpec, load_link
from testbed.cluster.routers import get_router
from testbed.config import EngineConfig
from testbed.sim.clock import VirtualClock

from .helpers import SIM, SMALL_TRACE, cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BS = 16


def engines(n, num_blocks=None, seed=0):
    config = EngineConfig(
        model="llama-3.1-8b", executor="sim", sim_config={"device": "h100-sxm"}, num_blocks=num_blocks, block_size=BS
    )
    return [Engine(config, clock=VirtualClock()) for _ in range(n)]


def pd_cluster(prefill=1, decode=2, decode_blocks=None, link=None):
    return DisaggregatedCluster(
        engines(prefill),
        engines(decode, decode_blocks),
        get_router("round_robin"),
        get_router("least_outstanding"),
        link or load_link("ib-400g"),
    )


def drain(cluster):
    delivered = []
    while cluster.has_unfinished():
        delivered += cluster.run_until(float("inf"))
    return delivered


def prompt(i, n):
    return [100 + (i * 7 + j) % 3000 for j in range(n)]


def test_kv_blocks_are_freed_on_the_prefill_replica_and_held_on_the_decode_one():
    cluster = pd_cluster(decode=1)
    tokens = prompt(0, 10 * BS + 5)  # 10 full blocks move, the partial one is recomputed on decode
    cluster.submit("a", tokens, SamplingParams(max_tokens=50, ignore_eos=True))
    prefill, decode = cluster.prefill[0], cluster.decode[0]
    transfer = None
    while transfer is None or transfer.decode_request is None:  # until the KV has landed
        cluster.run_next()
        transfer = cluster.transfers.get("a")
    moved = [block for _, block, sent in transfer.decode_blocks]
    assert len(moved) == 10 and all(sent for _, _, sent in transfer.decode_blocks)
    assert transfer.num_bytes == 10 * BS * decode.engine.arch.kv_bytes_per_token(2)
    ppool = prefill.engine.kv.pool
    assert ppool.num_free_blocks == ppool.num_blocks  # freed on the prefill side (still cached there)
    assert not prefill.engine.has_unfinished()
    while decode.engine.kv.num_held_blocks("a") == 0:  # until the decode replica admits it
        cluster.run_next()
    held = decode.engine.kv.req_blocks["a"]
    assert held[:10] == moved  # the moved blocks are the request's prefix on the decode side
    cluster.run_next()  # the step that admitted it ends: the transfer's own hold is dropped
    assert all(block.ref_cnt == 1 for block in moved)
    assert decode.engine.scheduler.requests["a"].num_cached_tokens == 10 * BS
    out = drain(cluster)
    assert [d.output.request_id for d in out] == ["a"] and out[0].replica == decode.index
    assert len(out[0].output.outputs[0].token_ids) == 50
    for replica in cluster.replicas:
        replica.engine.kv.pool.check_invariants()
        assert replica.engine.kv.num_free_blocks == replica.engine.kv.num_blocks


def test_every_request_finishes_once_on_one_decode_replica(tmp_path):
    overrides = [*SIM, *SMALL_TRACE, "replay=open_loop", "cluster.prefill_replicas=2", "cluster.decode_replicas=2"]
    run_cluster(cfg(*overrides), tmp_path / "pd")
    requests = pd.read_parquet(tmp_path / "pd" / "requests.parquet")
    summary = json.loads((tmp_path / "pd" / "summary.json").read_text())
    assert len(requests) == 40 and requests["request_id"].is_unique
    assert (requests["finish_reason"] == "length").all()
    assert (requests["output_tokens"] == requests["target_output_tokens"]).all()
    assert set(requests["prefill_replica"]) == {0, 1} and set(requests["replica"]) == {2, 3}
    assert summary["replica_roles"] == ["prefill", "prefill", "decode", "decode"]
    assert summary["config_id"] and summary["repeat"] == 0  # cluster runs aggregate like single-engine ones
    assert summary["replica_requests"][2] + summary["replica_requests"][3] == 40
    assert summary["replica_requests"][0] + summary["replica_requests"][1] == 40
    steps = pd.read_parquet(tmp_path / "pd" / "steps.parquet")
    prefill_steps = steps[steps["role"] == "prefill"]
    assert prefill_steps["num_decode_tokens"].sum() == 0  # max_tokens=1 there: prompts only
    assert prefill_steps["num_prefill_tokens"].sum() == (requests["prompt_tokens"] - requests["cached_tokens"]).sum()
    # order of events per request, and TTFT counts the transfer
    t = requests
    assert (t["arrival_time"] <= t["first_scheduled_time"]).all()
    assert (t["first_scheduled_time"] < t["prefill_finish_time"]).all()
    assert (t["prefill_finish_time"] <= t["transfer_start_time"]).all()
    assert (t["transfer_start_time"] < t["transfer_end_time"]).all()
    assert (t["transfer_end_time"] < t["first_token_time"]).all()
    link = load_link("ib-400g")
    expected = t["kv_transfer_bytes"] / (link.bandwidth_gbs * 1e9) + link.latency_us * 1e-6
    assert (t["kv_transfer_s"] - expected).abs().max() < 1e-12
    assert (t["kv_transfer_bytes"] == (t["prompt_tokens"] - 1) // BS * BS * 131072).all()  # nothing cached there
    assert summary["kv_transfers"] == 40 and summary["cluster_link"] == "ib-400g"
    # deterministic
    run_cluster(cfg(*overrides), tmp_path / "again")
    assert (tmp_path / "pd" / "summary.json").read_bytes() == (tmp_path / "again" / "summary.json").read_bytes()


def test_a_slow_link_adds_its_transfer_time_to_ttft():
    def ttft(link):
        cluster = pd_cluster(decode=1, link=link)
        cluster.submit("a", prompt(1, 40 * BS + 1), SamplingParams(max_tokens=4, ignore_eos=True))
        (out,) = drain(cluster)
        return out.output.metrics.first_token_time - out.output.metrics.arrival_time, out.handoff

    fast, transfer = ttft(LinkSpec("fast", 1e6, 0.0))
    slow, _ = ttft(LinkSpec("slow", 1.0, 100.0))
    assert slow - fast == pytest.approx(transfer.num_bytes / 1e9 + 100e-6 - transfer.num_bytes / 1e15, rel=1e-9)


def test_a_full_decode_replica_makes_transfers_wait():
    # the decode cache holds one request's KV at a time: the second waits for the first to finish
    need = -(-(30 * BS + 1 + 200) // BS)
    cluster = pd_cluster(decode=1, decode_blocks=need + 2)
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    for rid in ("a", "b"):
        cluster.submit(rid, prompt(ord(rid), 30 * BS + 1), params)
    out = {d.output.request_id: d for d in drain(cluster)}
    a, b = out["a"], out["b"]
    assert b.handoff.start_time > b.handoff.prefill_finish_time  # back-pressure: it waited
    assert b.handoff.start_time >= a.output.metrics.finish_time  # until a's blocks were freed
    assert a.handoff.start_time == a.handoff.prefill_finish_time
    decode = cluster.decode[0].engine
    assert decode.kv.num_free_blocks == decode.kv.num_blocks


def test_prefix_cached_on_the_decode_replica_is_not_sent_again():
    cluster = pd_cluster(decode=1)
    shared = prompt(5, 20 * BS)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    cluster.submit("first", [*shared, *prompt(6, 33)], params)
    drain(cluster)
    cluster.submit("second", [*shared, *prompt(7, 33)], params)
    (second,) = drain(cluster)
    sent = [s for _, _, s in second.handoff.decode_blocks]
    assert sent.count(False) == 20 and second.handoff.num_bytes == (len(sent) - 20) * BS * 131072
    assert second.handoff.prefill_output.metrics.num_cached_tokens == 20 * BS  # hit on the prefill side too


def test_pd_needs_a_prefix_cache():
    config = EngineConfig(
        model="tiny", executor="sim", sim_config={"device": "h100-sxm"}, enable_prefix_caching=False, num_blocks=64
    )
    with pytest.raises(ValueError, match="prefix caching on"):
        DisaggregatedCluster(
            [Engine(config, clock=VirtualClock())],
            [Engine(config, clock=VirtualClock())],
            get_router("round_robin"),
            get_router("round_robin"),
            load_link("nvlink"),
        )


@pytest.mark.parametrize(
    "link, match",
    [("infiniband-9000", "unknown link"), ({"bandwidth_gbs": 0, "latency_us": 1}, "bandwidth"), ({"x": 1}, "lacks")],
)
def test_bad_links_are_refused(link, match):
    with pytest.raises(ValueError, match=match):
        load_link(link)
