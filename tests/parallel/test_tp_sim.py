"""The simulator's tensor parallelism: ring collective costs by hand, a rank's share of the roofline, a scaled
profile, KV capacity per rank, and the 70B-on-8-H100s run the study makes."""

import json

import pytest

from testbed.cluster.links import load_link
from testbed.config import EngineConfig
from testbed.engine import Engine
from testbed.models.build import load_model_spec
from testbed.parallel.sim_cost import ScaledProfile, TensorParallelCost, all_reduce_s, gather_s, rank_arch
from testbed.sampling_params import SamplingParams
from testbed.sim.cost_models.profile import FEATURES, ProfileCost
from testbed.sim.cost_models.roofline import RooflineCost
from testbed.sim.devices import load_device
from testbed.sim.shape import StepShape

NVLINK = load_link({"name": "nvlink", "bandwidth_gbs": 450, "latency_us": 3})


def decode(seqs: int, context: int) -> StepShape:
    return StepShape(seqs, seqs, seqs, 0, 0, 0.0, 0, seqs, seqs, seqs * context)


def test_ring_collectives_by_hand():
    # 1 MB over 8 ranks: 2 * 7/8 * 1e6 / 450e9 s of bandwidth, 2 * 7 hops of 3 us
    assert all_reduce_s(1e6, 8, NVLINK) == pytest.approx(2 * 7 / 8 * 1e6 / 450e9 + 14 * 3e-6)
    assert gather_s(1e6, 8, NVLINK) == pytest.approx(7 / 8 * 1e6 / 450e9 + 7 * 3e-6)
    assert all_reduce_s(1e6, 1, NVLINK) == gather_s(1e6, 1, NVLINK) == 0.0


def test_a_tp_step_is_a_ranks_roofline_plus_the_real_engines_collectives():
    arch = load_model_spec("llama-3.1-70b").arch
    device = load_device("h100-sxm")
    whole = RooflineCost(arch, 2, device)
    shape = decode(32, 1000)
    for n in (2, 4, 8):
        rank = RooflineCost(rank_arch(arch, n), 2, device)
        assert rank.linear_params == pytest.approx(whole.linear_params / n)  # every projection split n ways
        assert rank.kv_bytes_per_token == whole.kv_bytes_per_token // n
        cost = TensorParallelCost(rank, arch, 2, n, NVLINK)
        comm = (2 * 80 + 1) * all_reduce_s(32 * 8192 * 2, n, NVLINK) + gather_s(32 * 128256 * 2, n, NVLINK)
        assert cost.step_time(shape) == pytest.approx(rank.step_time(shape) + comm)
    # a weight-bound decode step: the rank's time falls about n-fold, the collectives grow with n
    t = {n: TensorParallelCost(RooflineCost(rank_arch(arch, n), 2, device), arch, 2, n, NVLINK) for n in (2, 8)}
    assert t[8].per_rank.step_time(shape) < t[2].per_rank.step_time(shape) / 3
    assert t[8].comm_time(shape) > t[2].comm_time(shape)
    slow = load_link({"name": "pcie", "bandwidth_gbs": 63, "latency_us": 2})
    prefill = StepShape(1, 8192, 1, 1, 8192, 8192 * 4096.5, 8192, 0, 0, 0)
    assert TensorParallelCost(t[8].per_rank, arch, 2, 8, slow).comm_time(prefill) > t[8].comm_time(prefill)


def test_a_profile_is_scaled_except_its_per_step_and_per_sequence_terms(tmp_path):
    coef = dict(zip(FEATURES, [1e-3, 1e-4, 2e-5, 3e-5, 1e-9, 1e-8]))
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": 1, "model": "tiny", "kernel": "torch", "dtype": "float32",
                                "knee_tokens": 16.0, "coefficients": coef}))  # fmt: skip
    profile = ProfileCost(path, "tiny", "torch", "float32")
    shape = decode(8, 500)
    fixed = 1e-3 + 1e-4 * 8
    assert ScaledProfile(profile, 4).step_time(shape) == pytest.approx(fixed + (profile.step_time(shape) - fixed) / 4)


def sim_engine(tp: int, **kw) -> Engine:
    return Engine(
        EngineConfig(
            model="llama-3.1-70b",
            executor="sim",
            sim_config={"device": "h100-sxm", **kw},
            tensor_parallel_size=tp,
            max_num_batched_tokens=2048,
        )
    )


def test_llama_70b_runs_on_8_h100s_and_does_not_fit_one():
    with pytest.raises(ValueError, match="no KV block"):
        sim_engine(1)  # 141 GB of bf16 weights on one 80 GB device
    engines = {n: sim_engine(n) for n in (2, 8)}
    # per rank: 72 GB minus its share of the weights, over its share of a block's KV
    assert engines[8].kv.num_blocks > 4 * engines[2].kv.num_blocks
    times = {}
    for n, engine in engines.items():
        for i in range(4):
            engine.add_request(str(i), list(range(100, 612)), SamplingParams(max_tokens=32, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        times[n] = engine.clock()
    assert times[8] < times[2]  # a light load: TP=8's smaller share of the weights wins over its all-reduces


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(cost_model="replay_steps", run="/nonexistent"), "does not price tensor parallelism"),
        (dict(tp_link="warp-drive"), "unknown link 'warp-drive'"),
    ],
)
def test_sim_tp_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        sim_engine(8, **kw)


def test_sim_tp_refuses_head_counts_it_does_not_divide():
    with pytest.raises(ValueError, match="must divide the model's 4 query heads and 2 KV heads"):
        Engine(EngineConfig(model="tiny", executor="sim", sim_config={"device": "h100-sxm"}, tensor_parallel_size=3))
