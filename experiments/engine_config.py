"""Map a composed Hydra config onto the engine's EngineConfig (the one place that knows both shapes).

Each engine group is consumed whole: a key that no engine setting reads is refused naming it (a new key
must be mapped here, or it would be silently dropped), values are type-checked against EngineConfig's
fields, and a refused value is reported under its config key (`cache.block_size: ...`). Spec sheets travel
as values: the model group's hf_config, the device group's sheet (executor=sim), never a name to look up.
"""

import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from testbed.config import EngineConfig
from testbed.executor_kinds import executor_kind

# group key -> EngineConfig field, per group the engine reads
GROUP_FIELDS = {
    "model": {"name": "model", "hf_config": "hf_config"},
    "kernel": {"name": "kernel"},
    "scheduler": {
        "name": "scheduler",
        "options": "scheduler_options",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "max_num_seqs": "max_num_seqs",
        "enable_chunked_prefill": "enable_chunked_prefill",
        "preemption_mode": None,  # the policy's default for cache.preemption_mode (conf/cache/*.yaml read it)
    },
    "cache": {
        "name": "cache",
        "block_size": "block_size",
        "num_blocks": "num_blocks",
        "memory_gb": "kv_cache_memory_gb",
        "dtype": "kv_cache_dtype",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "prefix_caching": "enable_prefix_caching",
        "eviction": "eviction",
        "preemption_mode": "preemption_mode",
        "swap_space_gb": "swap_space_gb",
        "num_cpu_blocks": "num_cpu_blocks",
        "host_tier_gb": None,  # these four make EngineConfig.host_tier (_host_tier)
        "host_tier_blocks": None,
        "host_tier_write": None,
        "host_tier_link": None,
    },
    "device": {"torch_device": "device"},  # the rest is the spec sheet: the simulator's (sim_config.device)
    "parallel": {
        "tensor_parallel_size": "tensor_parallel_size",
        "timeout_s": "distributed_timeout_s",
        "link": None,  # executor=sim prices TP's collectives over it (conf/executor/sim.yaml: tp_link)
    },
}
TOP_FIELDS = {"seed": "seed", "dtype": "dtype", "max_model_len": "max_model_len"}


def engine_config_from_cfg(cfg: DictConfig) -> EngineConfig:
    values, keys = {}, {}  # EngineConfig field -> value, and -> the config key it came from
    for group, mapping in GROUP_FIELDS.items():
        node = _plain(cfg[group])
        unknown = sorted(set(node) - set(mapping) - ({"name", *_sheet_keys(node)} if group == "device" else set()))
        if unknown:
            raise ValueError(f"{group}.{unknown[0]}: not a setting the engine reads ({group} keys: {sorted(mapping)})")
        for key, field in mapping.items():
            if field is not None and key in node:
                values[field], keys[field] = node[key], f"{group}.{key}"
    for key, field in TOP_FIELDS.items():
        values[field], keys[field] = _plain(cfg[key]), key
    executor = _plain(cfg.executor)
    values["executor"], keys["executor"] = executor["name"], "executor.name"
    try:
        kind = executor_kind(executor["name"])
    except ValueError as e:
        raise ValueError(f"executor.name: {e}") from e
    for field, (value, key) in kind.engine_fields(executor, _plain(cfg.device)).items():
        values[field], keys[field] = value, key
    values["speculative_config"], keys["speculative_config"] = _spec_config(cfg), "spec"
    values["host_tier"], keys["host_tier"] = _host_tier(_plain(cfg.cache)), "cache.host_tier_gb"
    if cfg.get("structured_outputs") is not None:  # grammar limits: testbed.structured.limits
        values["structured_outputs_config"] = _plain(cfg.structured_outputs)
        keys["structured_outputs_config"] = "structured_outputs"
    if "sim_config" in values:  # its own fields, and the device sheet's, name themselves in its errors
        keys.update({k: f"executor.{k}" for k in values["sim_config"] if k != "device"})
        keys.update({k: f"device.{k}" for k in _sheet_keys(values["sim_config"]["device"]) if k != "name"})
    try:
        return EngineConfig(**values)
    except (TypeError, ValueError) as e:
        raise type(e)(_named(str(e), keys)) from e


def _named(message: str, keys: dict) -> str:
    """The message led by the config key of the field it is about (`block_size must ...` ->
    `cache.block_size: block_size must ...`); unchanged when it names none."""
    match = re.search(r"\b(\w+)(?::| must\b)", message)
    if match is None or match.group(1) not in keys:
        return message
    return f"{keys[match.group(1)]}: {message.removeprefix(match.group(1) + ': ')}"


def _sheet_keys(device: dict) -> set:
    from dataclasses import fields

    from testbed.sim.devices import DeviceSpec

    return {f.name for f in fields(DeviceSpec)} & set(device)


def _spec_config(cfg: DictConfig) -> dict | None:
    spec = cfg.get("spec")
    if not spec or spec.get("method", "none") == "none":
        return None
    return _plain(spec)


def _plain(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _host_tier(cache: dict) -> dict | None:
    """EngineConfig.host_tier from cache.host_tier_* (off while neither size is given; caches without the keys:
    None)."""
    if not any(k.startswith("host_tier_") for k in cache):
        return None
    return {
        "gb": cache.get("host_tier_gb"),
        "blocks": cache.get("host_tier_blocks"),
        "write": cache.get("host_tier_write", "back"),
        "link": cache.get("host_tier_link", "pcie-gen5"),
    }
