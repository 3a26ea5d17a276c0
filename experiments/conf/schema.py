"""Typed schemas of the config groups, registered in Hydra's ConfigStore (as `schema/<group>/<kind>`): each
option's yaml lists its schema first in its defaults (`/schema/cache@_here_: paged`), so a value of the
wrong type (`cache.block_size=abc`) is refused at compose time, naming the key, before any setting is
built. The schemas declare keys and types only: the yaml files hold the defaults, and ranges and names
are checked where the settings are built (experiments.run.settings).

The engine's groups are derived from the library's own group dataclasses (testbed.config: CacheConfig,
SchedulerConfig, ExecutorConfig with SimConfig, ParallelConfig, SpeculativeConfig), so a field added there
is a typed key here (and in the yaml, which gives its documented default). Fields mirror each option's keys
exactly, in the yaml's order (a schema field the yaml lacks would add a key to the recorded config).
OmegaConf has no unions but Optional: a field typed `str | dict` (a link's name or values) or `int | float`
(seconds a yaml writes as an int: a float field would turn 120 into 120.0 in every recorded config) is
`Any` here. A nested group dataclass is spread as prefixed keys (cache.host_tier -> host_tier_gb, ...).
The cluster's, the server's and the replay's schemas are derived the same way, from ClusterConfig,
ServerSettings and experiments.replay.options.ReplayOptions (whose fields also give run_settings' checks).

The trace group's schemas are its loaders' options (experiments.traces, experiments.sessions: each format's
DEFAULTS, the keys and defaults it takes), typed by TRACE_TYPES; a length spec (`{dist: uniform, low, high}`)
or a count range is one `Any` value the yaml makes with oc.create, so a plain override replaces it whole
(`trace.prompt_len={dist:uniform,low:32,high:256}`) and the loader checks it before the run. The model
group is typed from the library's ModelConfig in conf/config.yaml's defaults (`/schema/model@model`, before
the option), so its sheets (testbed/specs/model) stay plain spec data; hf_config is an open mapping (a
config.json's keys). The device and link groups are the library's spec sheets too: DeviceSpec and LinkSpec
type them when the run is built.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING  # a name: the option's yaml gives it

from experiments.replay.options import ReplayOptions
from testbed.cluster.config import ClusterConfig
from testbed.config import (
    CacheConfig,
    ExecutorConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SimConfig,
    SpeculativeConfig,
)
from testbed.server.settings import ServerSettings

SchemaField = tuple[str, Any, Any]  # (key, OmegaConf type, dataclasses.field with the default)


def fields_of(cls: type, *keys: str, skip: tuple = (), whole: tuple = ()) -> list[SchemaField]:
    """The schema fields of dataclass cls's fields `keys` (all but `skip` when none are named), in cls's
    order; a field that is itself a dataclass spread as `<name>_<its field>` keys; those in `whole` typed
    Any (a mapping a plain override replaces whole, as its yaml's oc.create value is, not merges into)."""
    hints = typing.get_type_hints(cls)
    out: list[SchemaField] = []
    for f in dataclasses.fields(cls):
        if (keys and f.name not in keys) or f.name in skip:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out += [(f"{f.name}_{key}", kind, default) for key, kind, default in fields_of(hints[f.name])]
        else:
            out.append((f.name, Any if f.name in whole else omegaconf_type(hints[f.name]), _default(f)))
    missing = set(keys) - {f.name for f in dataclasses.fields(cls)}
    assert not missing, f"{cls.__name__} has no fields {sorted(missing)}"
    return out


def omegaconf_type(annotation) -> Any:
    """The annotation as OmegaConf types it: Optional of one type; any other union is Any."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) > 1:
            return Any
        inner = omegaconf_type(options[0])
        return Any if inner is Any else Optional[inner]  # noqa: UP045 (OmegaConf reads typing.Optional)
    if annotation is dict or typing.get_origin(annotation) is dict:
        return dict[str, Any]
    if annotation in (int, float, bool, str) or typing.get_origin(annotation) is list:
        return annotation
    return Any


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return field(default_factory=f.default_factory)
    return field(default=f.default)


def schema(name: str, *parts: list[SchemaField]) -> type:
    """A dataclass of these fields, named `name` in this module (where pickle finds it: multirun launchers)."""
    cls = dataclasses.make_dataclass(name, [entry for part in parts for entry in part])
    cls.__module__ = __name__
    globals()[name] = cls
    return cls


def _insert(fields: list[SchemaField], before: str, *new: SchemaField) -> list[SchemaField]:
    at = [key for key, _, _ in fields].index(before)
    return [*fields[:at], *new, *fields[at:]]


# cache=paged: every CacheConfig field; cache=static_*: the contiguous allocators take no KV dtype or host tier
PagedCacheSchema = schema("PagedCacheSchema", fields_of(CacheConfig))
CacheSchema = schema("CacheSchema", fields_of(CacheConfig, skip=("dtype", "host_tier")))
# async_scheduling is the library's (LLM(async_scheduling=...)); a run takes the executor kind's default
_SCHEDULER = fields_of(SchedulerConfig, skip=("async_scheduling",))
SchedulerSchema = schema("SchedulerSchema", _SCHEDULER)
# a policy that sets the cache's default preemption mode (scheduler=mlfq: swap; conf/cache/*.yaml read it)
PreemptingSchedulerSchema = schema(
    "PreemptingSchedulerSchema", _insert(_SCHEDULER, "options", *fields_of(CacheConfig, "preemption_mode"))
)
# executor=real's own settings (CUDA graphs) are the library's; host: its step time; sim: SimConfig's fields,
# the device being the device group's sheet (a user's cost model takes +executor.cost_model_options={...})
ExecutorSchema = schema("ExecutorSchema", fields_of(ExecutorConfig, "name"))
HostExecutorSchema = schema("HostExecutorSchema", fields_of(ExecutorConfig, "name", "step_time_s"))
SimExecutorSchema = schema(
    "SimExecutorSchema", fields_of(ExecutorConfig, "name"), fields_of(SimConfig, skip=("device", "cost_model_options"))
)
# per method, the SpeculativeConfig fields it reads (a user's method takes +spec.options={...})
SpecSchema = schema("SpecSchema", fields_of(SpeculativeConfig, "method"))
LayerSkipSpecSchema = schema(
    "LayerSkipSpecSchema", fields_of(SpeculativeConfig, "method", "num_speculative_tokens", "num_layers")
)
DraftSpecSchema = schema(
    "DraftSpecSchema", fields_of(SpeculativeConfig, "method", "num_speculative_tokens", "model", "num_layers")
)
NgramSpecSchema = schema(
    "NgramSpecSchema",
    fields_of(SpeculativeConfig, "method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"),
)
# the link the simulator prices TP's collectives over (the link group, composed here), then ParallelConfig
ParallelSchema = schema("ParallelSchema", [("link", Any, field(default=None))], fields_of(ParallelConfig))
# the model: a name and its shape's overrides (the option's sheet gives them; model.hf_config.num_hidden_layers=16)
ModelSchema = schema("ModelSchema", fields_of(ModelConfig, "name", "hf_config"))

# The trace loaders' option types, by key (a key some format's DEFAULTS adds needs one here: trace_schemas
# refuses to build without it). Any: a value of several forms the loader checks (a length spec or an integer,
# [low, high] or an integer, a string or a list of strings, seconds an int or a float).
TRACE_TYPES: dict[str, Any] = {
    **{"name": str, "path": Optional[str], "start": int, "window": Optional[list[Any]]},  # noqa: UP045
    **{"max_requests": Optional[int], "time_scale": float, "seed": int, "overlength": str},  # noqa: UP045
    **{"zero_length": Optional[str], "rebase": bool, "ignore_eos": bool, "token_low": int, "horizon_s": Any},  # noqa: UP045
    **{"num_requests": int, "rate": Optional[float], "burstiness": float, "prompt_len": Any, "output_len": Any},  # noqa: UP045
    **{"prefix_groups": int, "prefix_len": int, "block_size": int, "models": Any, "log_types": Any, "shuffle": bool},
    **{"num_sessions": int, "turns": Any, "system_tokens": Any, "first_tokens": Any, "new_tokens": Any},
    **{"output_tokens": Any, "think_s": float, "think_dist": str, "session_rate": Optional[float]},  # noqa: UP045
    **{"max_sessions": Optional[int], "max_turns": Optional[int], "chat_template": bool},  # noqa: UP045
}


def trace_formats() -> dict[str, dict[str, Any]]:
    """Each trace format's options as its loader takes them (experiments.run.settings.trace_options): key ->
    default, in the order the yaml documents them (name, the format's own, then those every format shares)."""
    from experiments.sessions import sharegpt as sharegpt_sessions
    from experiments.sessions import synthetic as sessions
    from experiments.traces import COMMON_DEFAULTS, azure, burstgpt, mooncake, sharegpt, synthetic

    def request_trace(name: str, own: dict) -> dict:
        return {"name": name, **own, **{k: v for k, v in COMMON_DEFAULTS.items() if k != "name"}}

    formats = {m.__name__.rpartition(".")[2]: request_trace(m.__name__.rpartition(".")[2], m.DEFAULTS)
               for m in (azure, burstgpt, mooncake, sharegpt, synthetic)}  # fmt: skip
    formats["mooncake_sessions"] = request_trace("mooncake_sessions", mooncake.DEFAULTS)
    return {**formats, "sessions": sessions.DEFAULTS, "sharegpt_sessions": sharegpt_sessions.DEFAULTS}


def trace_schemas() -> dict[str, type]:
    out = {}
    for name, defaults in trace_formats().items():
        untyped = sorted(set(defaults) - set(TRACE_TYPES))
        assert not untyped, f"trace={name}: options {untyped} have no type in TRACE_TYPES"
        fields = [(key, TRACE_TYPES[key], _trace_default(key, value)) for key, value in defaults.items()]
        out[name] = schema("".join(part.title() for part in name.split("_")) + "TraceSchema", fields)
    return out


def _trace_default(key: str, value: Any) -> Any:
    if key == "path":  # MISSING, as a file-based format's yaml writes it (a yaml's `???` leaves a None in place)
        return field(default=MISSING)
    if isinstance(value, (dict, list)):  # a length spec, a count range
        return field(default_factory=functools.partial(copy.deepcopy, value))
    return field(default=value)


# the cluster's, the server's and the replay's own settings (router_options and a link: mappings, replaced whole)
ClusterSchema = schema("ClusterSchema", fields_of(ClusterConfig, whole=("router_options",)))
ServerSchema = schema("ServerSchema", fields_of(ServerSettings))
ReplaySchema = schema("ReplaySchema", fields_of(ReplayOptions))


@dataclass
class KernelSchema:
    name: str = MISSING


# group -> schema name -> schema; an option's yaml names one in its defaults
SCHEMAS: dict[str, dict[str, type]] = {
    "cache": {"paged": PagedCacheSchema, "static": CacheSchema},
    "scheduler": {"default": SchedulerSchema, "preempting": PreemptingSchedulerSchema},
    "executor": {"real": ExecutorSchema, "host": HostExecutorSchema, "sim": SimExecutorSchema},
    "spec": {"none": SpecSchema, "draft": DraftSpecSchema, "layerskip": LayerSkipSpecSchema, "ngram": NgramSpecSchema},
    "cluster": {"default": ClusterSchema},
    "replay": {"default": ReplaySchema},
    "server": {"default": ServerSchema},
    "parallel": {"default": ParallelSchema},
    "kernel": {"default": KernelSchema},
    "model": {"default": ModelSchema},
    "trace": trace_schemas(),
}


def register() -> None:
    store = ConfigStore.instance()
    for group, schemas in SCHEMAS.items():
        for name, schema in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=schema)
