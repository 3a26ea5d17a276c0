"""Helpers shared by the cluster tests."""

from hydra import compose, initialize_config_module

SIM = ["model=llama-3.1-8b", "executor=sim", "device=h100-sxm"]
SMALL_TRACE = [
    "trace=synthetic",
    "trace.num_requests=40",
    "trace.rate=200",
    "trace.prompt_len={dist:uniform,low:8,high:300}",
    "trace.output_len={dist:uniform,low:2,high:40}",
]


def cfg(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=["progress=false", *overrides])
