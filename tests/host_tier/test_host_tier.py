"""The host-memory KV tier: loads restore exactly what the device evicted; metrics; pricing; invariants."""

import random

import pytest
import torch

from testbed import Engine, SamplingParams
from testbed.config import EngineConfig
from testbed.core.host_tier import HostTierConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DOCS = 4


def engine(num_blocks, tier=None, executor="real", model="tiny", **kw):
    sim = {"device": "h100-sxm"} if executor == "sim" else None
    return Engine(EngineConfig(model=model, kernel="torch", block_size=16, num_blocks=num_blocks, max_num_seqs=4,
                               host_tier=tier, executor=executor, sim_config=sim, **kw))  # fmt: skip


def ask_each_doc_twice(e, before_second_round=None, check=False):
    """Four 48-token documents, each asked about twice (round robin, one at a time), greedy."""
    rng = random.Random(0)
    docs = [[rng.randrange(100, 250) for _ in range(48)] for _ in range(DOCS)]
    outs = {}
    for i, d in enumerate([*range(DOCS), *range(DOCS)]):
        if i == DOCS and before_second_round is not None:
            before_second_round(e)
        e.add_request(f"r{i}", docs[d] + [5 + i], SamplingParams(temperature=0, max_tokens=6))
        while e.has_unfinished():
            for o in e.step():
                if o.finished:
                    outs[o.request_id] = (list(o.outputs[0].token_ids), o.metrics.num_cached_tokens)
            if check:
                e.kv.pool.check_invariants()
                if e.kv.host_tier is not None:
                    e.kv.host_tier.check_invariants()
    return outs


@pytest.mark.parametrize("write", ["back", "through"])
def test_host_loads_restore_exactly_the_evicted_contents(write):
    """A device cache of 8 blocks holds one document (3 blocks + the rest): by the second round every
    document was evicted. With the host tier its blocks come back as hits and greedy tokens equal a run whose
    device cache holds everything; corrupting the host copies changes them (the check can fail)."""
    reference = ask_each_doc_twice(engine(400))
    assert [reference[f"r{i}"][1] for i in range(DOCS, 2 * DOCS)] == [48] * DOCS
    small = ask_each_doc_twice(engine(8))
    assert all(small[f"r{i}"][1] == 0 for i in range(2 * DOCS))  # evicted: no device hit at all
    e = engine(8, {"blocks": 64, "write": write})
    tiered = ask_each_doc_twice(e, check=True)
    assert tiered == reference  # the same tokens and the same 48 cached tokens on every second ask
    assert e.kv.host_hits == DOCS * 48 and e.kv.prefix_hits == DOCS * 48
    assert e.kv.host_tier.blocks_loaded == DOCS * 3

    def corrupt(eng):
        for k, v in eng.executor.copier.pairs[0][1]:
            k.normal_()
            v.normal_()

    broken = ask_each_doc_twice(engine(8, {"blocks": 64, "write": write}), before_second_round=corrupt)
    assert [broken[f"r{i}"][1] for i in range(DOCS, 2 * DOCS)] == [48] * DOCS
    assert any(broken[f"r{i}"][0] != reference[f"r{i}"][0] for i in range(DOCS, 2 * DOCS))


@pytest.mark.slow
def test_host_loads_restore_smollm2_greedy_tokens():
    """The same with the real SmolLM2-135M weights (minutes on a loaded 2-core CPU)."""
    reference = ask_each_doc_twice(engine(400, model="smollm2-135m"))
    e = engine(8, {"blocks": 64}, model="smollm2-135m")
    assert ask_each_doc_twice(e) == reference
    assert e.kv.host_hits == DOCS * 48


def test_a_small_host_tier_keeps_only_the_most_recent_evictions():
    e = engine(8, {"blocks": 6})  # two documents' worth
    outs = ask_each_doc_twice(e, check=True)
    assert e.kv.host_tier.evictions > 0
    hits = [outs[f"r{i}"][1] for i in range(DOCS, 2 * DOCS)]
    assert 0 < sum(hits) < DOCS * 48


def test_write_through_stores_on_release_write_back_on_eviction():
    back, through = engine(400, {"blocks": 64, "write": "back"}), engine(400, {"blocks": 64, "write": "through"})
    ask_each_doc_twice(back)
    ask_each_doc_twice(through)
    assert back.kv.host_tier.blocks_stored == 0  # nothing was ever evicted
    assert through.kv.host_tier.blocks_stored == DOCS * 3  # every document's full blocks, once


def test_simulator_prices_loads_and_stores_by_the_link():
    e = engine(8, {"blocks": 64, "link": "pcie-gen5"}, executor="sim")
    ask_each_doc_twice(e, check=True)
    cost = e.executor.copy_cost
    per_block = e.arch.kv_bytes_per_token(e.kv_dtype.itemsize) * 16
    assert cost.bytes_to_device == e.kv.host_tier.blocks_loaded * per_block > 0
    assert cost.bytes_to_host == e.kv.host_tier.blocks_stored * per_block > 0
    assert cost.load_seconds > 0
    slow = engine(8, {"blocks": 64, "link": {"name": "slow", "bandwidth_gbs": 0.001, "latency_us": 0}}, executor="sim")
    ask_each_doc_twice(slow)
    assert slow.executor.copy_cost.load_seconds > 100 * cost.load_seconds


def test_bad_tier_settings_are_refused():
    with pytest.raises(ValueError, match="host_tier_write"):
        HostTierConfig.from_any({"blocks": 4, "write": "sideways"})
    with pytest.raises(ValueError, match="unknown host tier keys"):
        HostTierConfig.from_any({"blocks": 4, "wrte": "back"})
    with pytest.raises(ValueError, match="prefix caching"):
        engine(8, {"blocks": 4}, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="holds no KV block"):
        engine(8, {"gb": 1e-9})


def test_swap_and_the_tier_share_the_host_pool_without_overlap():
    e = engine(8, {"blocks": 5}, preemption_mode="swap", num_cpu_blocks=3)
    host = e.executor.copier.pairs[0][1][0][0]
    assert host.shape[0] == 8
    assert sorted(e.kv.host_tier.free_ids) == [3, 4, 5, 6, 7]
    assert torch.equal(host, torch.zeros_like(host))


def test_runner_reports_the_device_host_miss_split(tmp_path):
    from experiments.run.runner import run_trace

    from ..sessions.test_sessions import cfg

    common = ["executor=sim", "device=h100-sxm", "trace=sessions", "replay=sessions", "trace.num_sessions=12",
              "trace.turns=4", "trace.think_s=2", "cache.block_size=16", "cache.num_blocks=40"]  # fmt: skip
    plain = run_trace(cfg(*common), tmp_path / "plain")
    tiered = run_trace(cfg(*common, "cache.host_tier_blocks=2000"), tmp_path / "tier")
    for s in (plain, tiered):
        total = s["kv_device_hit_tokens"] + s["kv_host_hit_tokens"] + s["kv_miss_tokens"]
        assert total == s["total_input_tokens"]
    assert plain["kv_host_hit_tokens"] == 0 and "kv_bytes_to_device" not in plain
    assert tiered["kv_host_hit_tokens"] > 0 and tiered["kv_miss_tokens"] < plain["kv_miss_tokens"]
    assert tiered["kv_bytes_to_device"] > 0 and tiered["kv_host_load_wait_s"] > 0
