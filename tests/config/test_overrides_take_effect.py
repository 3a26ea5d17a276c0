"""Overrides of a device's spec sheet, a model's shape and a link reach the simulator (they were dropped
when the library re-read its files by name): each changes simulated time as the roofline model says."""

import json

import pytest
from omegaconf import OmegaConf

from experiments.cluster.runner import run_cluster
from experiments.run.runner import run_trace
from experiments.run.settings import run_settings

from ..cluster.helpers import cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIM = ["model=llama-3.1-8b", "executor=sim", "device=h100-sxm"]
DECODE_BOUND = [  # 4 short prompts decoding 64 tokens each, all at t=0: steps read the weights
    "trace=synthetic",
    "trace.num_requests=4",
    "trace.rate=null",
    "trace.prompt_len={dist:fixed,value:16}",
    "trace.output_len={dist:fixed,value:64}",
]


def summary(tmp_path, name, *overrides, cluster=False):
    out = tmp_path / name
    (run_cluster if cluster else run_trace)(cfg(*SIM, *overrides), out)
    return json.loads((out / "summary.json").read_text())


def test_halving_hbm_bandwidth_doubles_decode_bound_tpot(tmp_path):
    base = summary(tmp_path, "base", *DECODE_BOUND)
    slow = summary(tmp_path, "slow", *DECODE_BOUND, "device.hbm_bandwidth_gbs=1675")
    # decode steps are weight reads (bandwidth-bound) plus fixed per-step/per-sequence overheads
    assert 1.9 < slow["mean_tpot_ms"] / base["mean_tpot_ms"] <= 2.0
    # the run folder's config.yaml is the config that ran: it builds the same settings
    saved = OmegaConf.load(tmp_path / "slow" / "config.yaml")
    assert run_settings(saved) == run_settings(cfg(*SIM, *DECODE_BOUND, "device.hbm_bandwidth_gbs=1675"))
    assert saved.device.hbm_bandwidth_gbs == 1675


def test_halving_the_layers_about_halves_step_time(tmp_path):
    base = summary(tmp_path, "base", *DECODE_BOUND)
    half = summary(tmp_path, "half", *DECODE_BOUND, "model.hf_config.num_hidden_layers=16")
    # the embedding and LM head (2 x 128256 x 4096 of ~8B parameters) do not shrink with the layers
    assert 0.5 < half["mean_tpot_ms"] / base["mean_tpot_ms"] < 0.62


def test_a_slower_link_raises_pd_ttft(tmp_path):
    pd_run = ["cluster=pd", *DECODE_BOUND, "trace.prompt_len={dist:fixed,value:2048}"]
    fast = summary(tmp_path, "fast", *pd_run, cluster=True)
    slow = summary(tmp_path, "slow", *pd_run, "link.bandwidth_gbs=0.5", cluster=True)
    assert fast["cluster_link_bandwidth_gbs"] == 50 and slow["cluster_link_bandwidth_gbs"] == 0.5
    # 4 x 2048 tokens of KV (128 KiB each: 32 layers x 8 KV heads x 128 x 2 x bf16) one at a time at 0.5 GB/s
    assert slow["mean_ttft_ms"] > fast["mean_ttft_ms"] + 500
