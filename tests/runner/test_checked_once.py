"""A replay checks each request once: it validates the whole trace before anything runs and submits the
very objects it checked (Engine.add_request's `validated`); anything else add_request still checks."""

from collections import Counter

import pytest
from hydra import compose, initialize_config_module

from experiments.run.runner import run_trace
from testbed import Engine, EngineConfig, SamplingParams
from testbed.input_processor import InputProcessor, ValidatedRequests

SIM = ["executor=sim", "device=h100-sxm", "model=llama-3.1-8b", "progress=false", "wandb.enabled=false"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["trace=azure", "trace.max_requests=30", "replay=open_loop"],
        ["trace=azure", "trace.max_requests=30", "replay=open_loop", "cluster.replicas=2"],
        # turns are built when sent (their prompt is the history so far): the objects submitted are not
        # those validated up front, so a first turn is checked again, a later one once
        ["trace=sessions", "replay=sessions", "trace.num_sessions=4", "trace.session_rate=2"],
    ],
    ids=["engine", "cluster", "sessions"],
)
def test_replay_checks_each_request_once(tmp_path, monkeypatch, overrides):
    checked: Counter = Counter()
    real = InputProcessor.check

    def counting(self, prompt_token_ids, params, request_id="?"):
        checked[request_id] += 1
        return real(self, prompt_token_ids, params, request_id)

    monkeypatch.setattr(InputProcessor, "check", counting)
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=SIM + overrides)
    if any(o.startswith("cluster.") for o in overrides):
        from experiments.cluster.runner import run_cluster

        summary = run_cluster(cfg, tmp_path / "run")
    else:
        summary = run_trace(cfg, tmp_path / "run")
    assert summary["completed"] == len(checked) > 0
    if "replay=sessions" in overrides:
        assert {checked[rid] for rid in checked if rid.endswith(".t0")} == {2}
        assert {checked[rid] for rid in checked if not rid.endswith(".t0")} == {1}
    else:
        assert set(checked.values()) == {1}


def test_only_the_validated_objects_skip_the_check():
    validated = ValidatedRequests()
    prompt, params = [5, 6, 7], SamplingParams(max_tokens=4)
    validated.add("a", prompt, params)
    assert not validated.take("a", list(prompt), params)  # an equal copy is not what was checked
    assert not validated.take("a", prompt, params)  # forgotten once taken
    validated.add("b", prompt, params)
    assert not validated.take("b", prompt, SamplingParams(max_tokens=4))
    validated.add("c", prompt, params)
    assert validated.take("c", prompt, params)


def test_add_request_still_refuses_by_default():
    config = EngineConfig(
        model="llama-3.1-8b", executor="sim", sim_config={"device": "h100-sxm"}, num_blocks=64, max_model_len=256
    )
    engine = Engine(config)
    with pytest.raises(TypeError, match="prompt_token_ids must be a list"):
        engine.add_request("s", "hello", SamplingParams())
    with pytest.raises(TypeError, match="token ids must be ints"):
        engine.add_request("f", [1, 2.5], SamplingParams())
    with pytest.raises(ValueError, match="300 tokens.*max_model_len=256"):
        engine.add_request("long", [100] * 300, SamplingParams(max_tokens=1))
    assert not engine.has_unfinished()
