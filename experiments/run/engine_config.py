"""Map a composed Hydra config onto the engine's EngineConfig (the one place that knows both shapes).

Each engine group is consumed whole: a key that no engine setting reads is refused naming it (a new key
must be mapped here, or it would be silently dropped), each config group object (testbed.config) is built
from its keys and checks them, and a refused value is reported under its config key (`cache.block_size:
...`). Spec sheets travel as values: the model group's hf_config, the device group's sheet (executor=sim),
never a name to look up.
"""

import dataclasses
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from testbed.config import (
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
from testbed.executor_kinds import executor_kind

HOST_TIER = "host_tier_"  # cache.host_tier_<field>: the cache's HostTierConfig


def _keys(group: type, *, skip: tuple = ()) -> dict[str, str]:
    """A config group's keys that are fields of the library's group dataclass: key -> its field (the group's
    schema, experiments/conf/schema.py, is derived from the same dataclass)."""
    return {f.name: f.name for f in dataclasses.fields(group) if f.name not in skip}


# config group -> {key: "engine field.group field", or None: read by no engine setting (a note says by what)}
GROUP_FIELDS: dict[str, dict[str, str | None]] = {
    "model": {"name": "model.name", "hf_config": "model.hf_config"},
    "kernel": {"name": "executor.kernel"},
    "scheduler": {
        **{k: f"scheduler.{f}" for k, f in _keys(SchedulerConfig).items()},
        "preemption_mode": None,  # the policy's default for cache.preemption_mode (conf/cache/*.yaml read it)
    },
    "cache": {
        **{k: f"cache.{f}" for k, f in _keys(CacheConfig, skip=("host_tier",)).items()},
        **{HOST_TIER + f.name: f"cache.host_tier.{f.name}" for f in dataclasses.fields(HostTierConfig)},
    },
    "device": {"torch_device": "executor.device"},  # the rest is the spec sheet: the simulator's (executor.sim)
    "parallel": {
        **{k: f"parallel.{f}" for k, f in _keys(ParallelConfig).items()},
        "link": None,  # executor=sim prices TP's collectives over it (conf/executor/sim.yaml: tp_link)
    },
}
TOP_FIELDS = {"seed": "seed", "dtype": "model.dtype", "max_model_len": "model.max_model_len"}
GROUPS = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "executor": ExecutorConfig,
          "parallel": ParallelConfig}  # fmt: skip


def engine_config_from_cfg(cfg: DictConfig) -> EngineConfig:
    values: dict[str, dict] = {group: {} for group in GROUPS}  # engine field -> its group's fields -> value
    keys: dict[str, dict] = {group: {} for group in GROUPS}  # ... -> the config key each came from
    seed = _plain(cfg.seed)

    def put(path: str, value, key: str) -> None:
        group, _, field = path.partition(".")
        if "." in field:  # a group inside the group (cache.host_tier.gb: its errors name their keys)
            inner, _, field = field.partition(".")
            values[group].setdefault(inner, {})[field] = value
        else:
            values[group][field], keys[group][field] = value, key

    for group, mapping in GROUP_FIELDS.items():
        node = _plain(cfg[group])
        unknown = sorted(set(node) - set(mapping) - ({"name", *_sheet_keys(node)} if group == "device" else set()))
        if unknown:
            raise ValueError(f"{group}.{unknown[0]}: not a setting the engine reads ({group} keys: {sorted(mapping)})")
        for key, path in mapping.items():
            if path is not None and key in node:
                put(path, node[key], f"{group}.{key}")
    for key, path in TOP_FIELDS.items():
        if path != "seed":
            put(path, _plain(cfg[key]), key)
    executor = _plain(cfg.executor)
    put("executor.name", executor["name"], "executor.name")
    try:
        kind = executor_kind(executor["name"])
    except ValueError as e:
        raise ValueError(f"executor.name: {e}") from e
    for field, (value, key) in kind.executor_fields(executor, _plain(cfg.device)).items():
        put(f"executor.{field}", value, key)
    sim = values["executor"].get("sim")
    if sim is not None:  # its own fields, and the device sheet's, name themselves in its errors
        keys["executor"].update({k: f"executor.{k}" for k in sim if k != "device"})
        keys["executor"].update({k: f"device.{k}" for k in _sheet_keys(sim["device"]) if k != "name"})
    groups = {name: _built(lambda v, cls=cls: cls(**v), values[name], keys[name]) for name, cls in GROUPS.items()}
    spec = _spec_config(cfg) or {}
    speculative = _built(SpeculativeConfig.from_any, spec, {k: f"spec.{k}" for k in spec})
    structured = StructuredOutputsConfig.from_any(_plain(cfg.get("structured_outputs")))
    try:
        return EngineConfig(**groups, speculative=speculative, structured_outputs=structured, seed=seed)
    except (TypeError, ValueError) as e:
        raise type(e)(_named(str(e), {"seed": "seed"})) from e


def _built(make, values: dict, keys: dict) -> Any:
    """make(values), its error led by the config key it is about."""
    try:
        return make(values)
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
    from testbed.sim.devices import DeviceSpec

    return {f.name for f in dataclasses.fields(DeviceSpec)} & set(device)


def _spec_config(cfg: DictConfig) -> dict | None:
    spec = cfg.get("spec")
    if not spec or spec.get("method", "none") == "none":
        return None
    return _plain(spec)


def _plain(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
