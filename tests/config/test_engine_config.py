"""EngineConfig as one object per group (testbed.config): the nested form, the flat keywords (LLM(...),
EngineConfig(block_size=...)) and the composed Hydra config build the same objects, and each group refuses
its own bad values naming the field, as the caller named it."""

from __future__ import annotations

import dataclasses
from importlib import resources

import pytest
import yaml
from hydra import compose, initialize_config_module

from experiments.run.engine_config import engine_config_from_cfg
from testbed.config import (
    FLAT_KEYWORDS,
    CacheConfig,
    EngineConfig,
    ExecutorConfig,
    HostTierConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    StructuredOutputsConfig,
)

FLAT = dict(
    model="tiny",
    max_model_len=256,
    dtype="float32",
    kernel="torch",
    cache="paged",
    block_size=32,
    num_blocks=128,
    kv_cache_memory_gb=2.0,
    kv_cache_dtype="float16",
    enable_prefix_caching=False,
    eviction="lfu",
    preemption_mode="swap",
    num_cpu_blocks=8,
    host_tier={"blocks": 64, "write": "through"},
    scheduler="sjf",
    scheduler_options={"by": "prompt"},
    max_num_batched_tokens=256,
    max_num_seqs=8,
    enable_chunked_prefill=False,
    async_scheduling=False,
    executor="host",
    host_step_time_s=0.01,
    distributed_timeout_s=60.0,
    speculative_config={"method": "ngram", "num_speculative_tokens": 2},
    structured_outputs_config={"compile_threads": 1},
    seed=7,
)
NESTED = dict(
    model=ModelConfig("tiny", dtype="float32", max_model_len=256),
    cache=CacheConfig(
        block_size=32,
        num_blocks=128,
        memory_gb=2.0,
        dtype="float16",
        prefix_caching=False,
        eviction="lfu",
        preemption_mode="swap",
        num_cpu_blocks=8,
        host_tier=HostTierConfig(blocks=64, write="through"),
    ),
    scheduler=SchedulerConfig(
        "sjf",
        max_num_batched_tokens=256,
        max_num_seqs=8,
        enable_chunked_prefill=False,
        options={"by": "prompt"},
        async_scheduling=False,
    ),
    executor=ExecutorConfig("host", kernel="torch", step_time_s=0.01),
    parallel=ParallelConfig(timeout_s=60.0),
    speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=2),
    structured_outputs=StructuredOutputsConfig(compile_threads=1),
    seed=7,
)


def test_nested_and_flat_construction_give_equal_configs():
    flat, nested = EngineConfig(**FLAT), EngineConfig(**NESTED)
    assert flat == nested
    assert flat.cache.block_size == 32 and flat.cache.host_tier.blocks == 64 and flat.executor.step_time_s == 0.01
    assert EngineConfig.from_kwargs(**FLAT) == nested  # LLM's way in
    mixed = EngineConfig(cache=NESTED["cache"], **{k: v for k, v in FLAT.items() if FLAT_KEYWORDS[k][0] != "cache"})
    assert mixed == nested
    assert EngineConfig() == EngineConfig(model=ModelConfig(), cache=CacheConfig(), seed=0)


def test_every_flat_keyword_reaches_its_field():
    """Each flat keyword sets the group field it names (a keyword that landed elsewhere would be dropped)."""
    flat = EngineConfig(**FLAT)
    for keyword, (group, field) in FLAT_KEYWORDS.items():
        if keyword in FLAT and field is not None:
            value = getattr(getattr(flat, group), field)
            assert value == FLAT[keyword] or isinstance(value, HostTierConfig), keyword
    assert set(FLAT) <= set(FLAT_KEYWORDS)


def test_replace_keeps_the_groups_and_checks_again():
    config = EngineConfig(**FLAT)
    replica = dataclasses.replace(config, seed=8)
    assert replica.seed == 8 and replica.cache is config.cache
    with pytest.raises(ValueError, match="not triton"):  # a check across groups runs on the new config
        dataclasses.replace(config, executor=ExecutorConfig("host", kernel="triton"))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ModelConfig(dtype="int8"), "^dtype must be"),
        (lambda: ModelConfig(max_model_len=0), "^max_model_len must be"),
        (lambda: ModelConfig(hf_config=[1]), "^hf_config: must be a mapping"),
        (lambda: CacheConfig(block_size=0), "^block_size must be"),
        (lambda: CacheConfig(block_size="16"), "^block_size: must be an integer"),
        (lambda: CacheConfig(num_blocks=0), "^num_blocks must be"),
        (lambda: CacheConfig(memory_gb=float("inf")), "^memory_gb must be"),
        (lambda: CacheConfig(dtype="fp8"), "^dtype must be"),
        (lambda: CacheConfig(gpu_memory_utilization=1.5), "^gpu_memory_utilization must be"),
        (lambda: CacheConfig(preemption_mode="drop"), "^preemption_mode must be"),
        (lambda: CacheConfig(num_cpu_blocks=0), "^num_cpu_blocks must be"),
        (lambda: CacheConfig(host_tier={"write": "around"}), "host_tier_write must be"),
        (lambda: SchedulerConfig(max_num_seqs=0), "^max_num_seqs must be"),
        (lambda: SchedulerConfig(max_num_batched_tokens=0), "^max_num_batched_tokens must be"),
        (lambda: SchedulerConfig(options=None), "^options: must be a mapping"),
        (lambda: ParallelConfig(tensor_parallel_size=0), "^tensor_parallel_size must be"),
        (lambda: ParallelConfig(timeout_s=0), "^timeout_s must be"),
        (lambda: ExecutorConfig(cuda_graph_sizes=[]), "^cuda_graph_sizes must be"),
        (lambda: ExecutorConfig(step_time_s="slow"), "^step_time_s: must be a number"),
        (
            lambda: ExecutorConfig("sim", sim={"spec_acceptance": 2, "cost_model": "profile", "profile": "p"}),
            "^spec_acceptance must be",
        ),
    ],
)
def test_each_group_refuses_its_own_bad_values_naming_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kv_cache_memory_gb": 0}, "^kv_cache_memory_gb must be"),
        ({"kv_cache_dtype": "fp8"}, "^kv_cache_dtype must be"),
        ({"enable_prefix_caching": "yes"}, "^enable_prefix_caching: must be"),
        ({"distributed_timeout_s": -1}, "^distributed_timeout_s must be"),
        ({"scheduler_options": [1]}, "^scheduler_options: must be"),
        ({"host_step_time_s": "x"}, "^host_step_time_s: must be"),
        ({"block_size": 2048}, "^block_size must be"),
        ({"seed": "0"}, "^seed: must be an integer"),
    ],
)
def test_flat_keywords_are_named_in_errors_as_given(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="tiny", **kwargs)


def test_unknown_keywords_and_a_group_given_twice_are_refused():
    with pytest.raises(TypeError, match=r"unknown engine options \['blocksize'\]"):
        EngineConfig(blocksize=16)
    with pytest.raises(TypeError, match=r"unknown engine options \['speculative'\]"):
        EngineConfig(speculative={"method": "ngram"})  # a group by its name is its object
    with pytest.raises(TypeError, match=r"cache is given as a CacheConfig and by \['block_size'\]"):
        EngineConfig(cache=CacheConfig(), block_size=32)


@pytest.fixture(scope="module")
def composed():
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        yield lambda *overrides: engine_config_from_cfg(compose("config", overrides=list(overrides)))


def test_groups_built_from_the_composed_config_equal_those_from_flat_keywords(composed):
    built = composed(
        "model=tiny",
        "max_model_len=256",
        "dtype=float32",
        "kernel=torch",
        "cache.block_size=32",
        "cache.num_blocks=128",
        "cache.memory_gb=2.0",
        "cache.dtype=float16",
        "cache.prefix_caching=false",
        "cache.eviction=lfu",
        "cache.preemption_mode=swap",
        "cache.num_cpu_blocks=8",
        "cache.host_tier_blocks=64",
        "cache.host_tier_write=through",
        "scheduler=sjf",
        "scheduler.options.by=prompt",
        "scheduler.max_num_batched_tokens=256",
        "scheduler.max_num_seqs=8",
        "scheduler.enable_chunked_prefill=false",
        "executor=host",
        "executor.step_time_s=0.01",
        "parallel.timeout_s=60",
        "spec=ngram",
        "spec.num_speculative_tokens=2",
        "structured_outputs.compile_threads=1",
        "seed=7",
    )
    tiny = yaml.safe_load((resources.files("testbed.specs") / "model" / "tiny.yaml").read_text())
    flat = EngineConfig(**{**FLAT, "async_scheduling": None, "hf_config": tiny["hf_config"]})  # the sheet's values
    sjf = flat.scheduler.options | {k: v for k, v in built.scheduler.options.items() if k != "by"}
    assert built.scheduler == dataclasses.replace(flat.scheduler, options=sjf)  # the yaml's options too
    for group in ("model", "cache", "executor", "parallel", "speculative", "structured_outputs", "seed"):
        assert getattr(built, group) == getattr(flat, group), group


def test_the_default_composed_config_is_the_default_engine_config(composed):
    assert composed() == EngineConfig()
    sim = composed("executor=sim", "device=h100-sxm", "model=llama-3.1-8b")
    assert sim.executor.sim is not None and sim.executor.sim.device.name == "h100-sxm"
    assert sim.executor == ExecutorConfig("sim", device="cuda", sim=sim.executor.sim)
