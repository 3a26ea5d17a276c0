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

The trace group has no schema: its documented value forms are replaced whole (`~trace.prompt_len
+trace.prompt_len={...}`), which a structured config refuses (no deletion); its loaders refuse unknown keys
and bad values by name. The device, link and model groups are the library's spec sheets (testbed/specs,
read without Hydra too): DeviceSpec, LinkSpec and the model's config type them when the run is built.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING  # a name: the option's yaml gives it

from testbed.config import CacheConfig, ExecutorConfig, ParallelConfig, SchedulerConfig, SimConfig, SpeculativeConfig

SchemaField = tuple[str, Any, Any]  # (key, OmegaConf type, dataclasses.field with the default)


def fields_of(cls: type, *keys: str, skip: tuple = ()) -> list[SchemaField]:
    """The schema fields of dataclass cls's fields `keys` (all but `skip` when none are named), in cls's
    order; a field that is itself a dataclass spread as `<name>_<its field>` keys."""
    hints = typing.get_type_hints(cls)
    out: list[SchemaField] = []
    for f in dataclasses.fields(cls):
        if (keys and f.name not in keys) or f.name in skip:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out += [(f"{f.name}_{key}", kind, default) for key, kind, default in fields_of(hints[f.name])]
        else:
            out.append((f.name, omegaconf_type(hints[f.name]), _default(f)))
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


@dataclass
class ClusterSchema:
    replicas: int = 1
    router: str = "round_robin"
    router_options: Any = None  # a mapping, replaced whole by a plain override (cluster.router_options={...})
    decode_router: str = "least_outstanding"
    prefill_replicas: int = 0
    decode_replicas: int = 0
    link: Any = None  # the link group's values
    backends: list[str] = field(default_factory=list)
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 2.0
    unhealthy_after: int = 2
    request_timeout_s: Any = 600  # seconds, int or float
    stall_timeout_s: float = 60.0
    failure_window_s: float = 30.0
    metrics_backend_urls: bool = False
    threads_per_replica: int | None = None


@dataclass
class ReplaySchema:
    name: str = MISSING
    concurrency: int | None = None
    temperature: float = 0.0
    length_scale: float = 1.0
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_duration_s: float | None = None
    repeats: int = 1
    repeat_seeds: list[Any] = field(default_factory=list)  # config keys: experiments.run.repeats names a bad one
    redraw_workload: bool | None = None
    repeat: int | None = None
    warmup_runs: int = 0


@dataclass
class ServerSchema:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_waiting: int = 1024
    graceful_timeout_s: Any = 30  # seconds, int or float
    served_model_name: str | None = None
    log_level: str = "info"
    access_log: bool = False
    max_body_bytes: int = 4194304
    max_prompt_chars: int = 1000000
    header_timeout_s: Any = 20  # seconds, int or float
    body_timeout_s: Any = 60  # seconds, int or float
    tokenizer_threads: int = 2
    tool_parser: str | None = "hermes"
    json_max_whitespace: int | None = 16


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
}


def register() -> None:
    store = ConfigStore.instance()
    for group, schemas in SCHEMAS.items():
        for name, schema in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=schema)
