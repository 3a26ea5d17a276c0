"""The names others rely on: `run.py scheduler=NAME cache=NAME cache.eviction=NAME` and the LLM kwargs."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from experiments.run.engine_config import engine_config_from_cfg
from testbed import LLM, SamplingParams
from testbed.config import EngineConfig
from testbed.core.allocators import ALLOCATORS, get_allocator
from testbed.core.eviction import EVICTION_POLICIES
from testbed.core.policies import POLICIES, get_policy

CONF = Path(__file__).resolve().parents[3] / "experiments" / "conf"


def _cfg(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("scheduler", sorted(POLICIES))
def test_every_scheduler_has_a_config_that_builds_its_policy(scheduler):
    ec = engine_config_from_cfg(_cfg(f"scheduler={scheduler}"))
    assert ec.scheduler.name == scheduler
    kv = get_allocator("paged", 64, 16, max_model_len=1024)
    assert get_policy(ec.scheduler.name, kv=kv, **ec.scheduler.options).name == scheduler


@pytest.mark.parametrize("cache", sorted(ALLOCATORS))
def test_every_allocator_has_a_config(cache):
    ec = engine_config_from_cfg(_cfg(f"cache={cache}", "cache.eviction=lfu", "cache.preemption_mode=swap"))
    assert (ec.cache.name, ec.cache.eviction, ec.cache.preemption_mode) == (cache, "lfu", "swap")
    assert set(EVICTION_POLICIES) >= {"lru", "lfu"}


def test_offline_api_names():
    llm = LLM(
        model="tiny",
        max_model_len=128,
        scheduler="sjf",
        cache="paged",
        preemption_mode="swap",
        eviction="lfu",
        num_blocks=64,
        num_cpu_blocks=16,
    )
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(out[0].outputs[0].token_ids) == 3
    assert llm.engine.scheduler.policy.name == "sjf" and llm.engine.scheduler.swap is not None
    with pytest.raises(ValueError, match="preemption_mode"):
        EngineConfig(preemption_mode="drop")
    with pytest.raises(ValueError, match="unknown cache"):
        LLM(model="tiny", max_model_len=128, cache="buddy")


def test_static_allocator_rejects_what_can_never_fit():
    llm = LLM(model="tiny", max_model_len=128, cache="static_max", block_size=1, num_blocks=100)
    with pytest.raises(ValueError, match="KV blocks"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3))  # reserves 128 slots of 100
