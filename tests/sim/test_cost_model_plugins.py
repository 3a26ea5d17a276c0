"""A researcher's own cost model by import path (`executor.cost_model=mymod:ConstantCost`): it prices every
step of a simulated run, its options are checked as a built-in's, and misspellings are refused by name."""

import json
import textwrap

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from experiments.run.runner import run_trace
from experiments.run.settings import run_settings
from testbed import Engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODULE = """
from testbed.sim.cost_models.base import CostModel


class ConstantCost(CostModel):
    name = "constant"

    def __init__(self, step_ms: float = 1.0):
        if step_ms <= 0:
            raise ValueError(f"step_ms must be > 0, got {step_ms}")
        self.step_s = step_ms / 1e3

    def step_time(self, shape):
        return self.step_s


class RankConstant(ConstantCost):
    tensor_parallel = "rank"  # the constant is one rank's step: the collectives come on top


class NotACostModel:
    pass
"""
WORKLOAD = [
    "model=tiny",
    "executor=sim",
    "trace=synthetic",
    "trace.num_requests=6",
    "trace.rate=null",  # all at t=0: the schedule does not depend on the step price
    "trace.prompt_len={dist:uniform,low:8,high:48}",
    "trace.output_len={dist:uniform,low:2,high:16}",
    "progress=false",
]


@pytest.fixture
def mymod(researcher_folder):
    (researcher_folder / "mymod.py").write_text(textwrap.dedent(MODULE))


def cfg(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=[*WORKLOAD, *overrides])


def simulate(tmp_path, step_ms):
    out = tmp_path / f"run_{step_ms}"
    run_trace(cfg("executor.cost_model=mymod:ConstantCost", f"+executor.cost_model_options={{step_ms:{step_ms}}}"), out)
    return json.loads((out / "summary.json").read_text()), pd.read_parquet(out / "steps.parquet")


def test_a_users_cost_model_prices_every_step(tmp_path, mymod):
    fast, fast_steps = simulate(tmp_path, 5)
    slow, slow_steps = simulate(tmp_path, 10)
    assert fast["sim_cost_model"] == "constant"
    assert fast_steps["duration_s"].tolist() == pytest.approx([0.005] * len(fast_steps))
    assert slow_steps["duration_s"].tolist() == pytest.approx([0.010] * len(slow_steps))
    # the same schedule at twice the price: every latency doubles
    assert len(fast_steps) == len(slow_steps) == fast["sim_steps"]
    assert fast["sim_simulated_seconds"] == pytest.approx(0.005 * fast["sim_steps"])
    for key in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "duration"):
        assert slow[key] == pytest.approx(2 * fast[key]), key


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["+executor.cost_model_options={step_mss:5}"], r"takes no options \['step_mss'\]; its options: \['step_ms'\]"),
        (["+executor.cost_model_options={step_ms:-1}"], "step_ms must be > 0"),
        (["executor.cost_model=mymod:NotACostModel"], "is not a subclass of testbed.sim.cost_models.base.CostModel"),
        (["executor.cost_model=roofine"], r"unknown sim cost_model 'roofine'; choose one of \['roofline', 'profile'"),
        (["executor.cost_model=roofline", "device=h100-sxm", "+executor.cost_model_options={x:1}"], "takes no opt"),
    ],
)
def test_a_wrong_cost_model_or_option_is_refused_before_the_run(mymod, overrides, match):
    with pytest.raises(ValueError, match=match):  # the settings (names, options) or the build (values)
        Engine(run_settings(cfg("executor.cost_model=mymod:ConstantCost", *overrides)).engine)


def test_a_users_cost_model_prices_tensor_parallelism_only_when_it_says_how(mymod):
    from testbed.config import EngineConfig
    from testbed.sampling_params import SamplingParams

    def engine(cost_model):
        sim = {"cost_model": cost_model, "cost_model_options": {"step_ms": 1.0}, "device": "h100-sxm"}
        return Engine(EngineConfig(model="tiny", executor="sim", tensor_parallel_size=2, sim_config=sim))

    with pytest.raises(ValueError, match="does not price tensor parallelism"):
        engine("mymod:ConstantCost")
    tp = engine("mymod:RankConstant")
    tp.add_request("a", list(range(100, 132)), SamplingParams(max_tokens=1, ignore_eos=True))
    tp.step()
    assert tp.clock() > 0.001  # the rank's constant step plus the all-reduces over the TP link
