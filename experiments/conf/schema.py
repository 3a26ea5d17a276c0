"""Typed schemas of the config groups, registered in Hydra's ConfigStore (as `schema/<group>/<kind>`): each
option's yaml lists its schema first in its defaults (`/schema/cache/paged@_here_`), so a value of the
wrong type (`cache.block_size=abc`) is refused at compose time, naming the key, before any setting is
built. The schemas declare keys and types only: the yaml files hold the defaults, and ranges and names
are checked where the settings are built (experiments.settings).

Fields mirror each option's keys exactly (a schema field the yaml lacks would add a key to the composed
config). Numbers a yaml writes as an int but a user may give as a float (seconds) are `Any`: OmegaConf has
no numeric union, and a float field would turn 30 into 30.0 in every recorded config. The trace group has
no schema: its documented value forms are replaced whole (`~trace.prompt_len +trace.prompt_len={...}`),
which a structured config refuses (no deletion); its loaders refuse unknown keys and bad values by name.
The device, link and model groups are the library's spec sheets (testbed/specs, read without Hydra too):
DeviceSpec, LinkSpec and the model's config type them when the run is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING  # a name: the option's yaml gives it


@dataclass
class CacheSchema:
    """cache=static_*: a contiguous allocator (testbed.core.allocators)."""

    name: str = MISSING
    block_size: int = 16
    num_blocks: int | None = None
    memory_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool = True
    eviction: str = "lru"
    preemption_mode: str = "recompute"
    swap_space_gb: float = 1.0
    num_cpu_blocks: int | None = None


@dataclass
class PagedCacheSchema:
    """cache=paged: a KV dtype and the host-memory tier beside CacheSchema's keys (fields in the yaml's order:
    it is the recorded config's)."""

    name: str = MISSING
    block_size: int = 16
    num_blocks: int | None = None
    memory_gb: float = 1.0
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool = True
    eviction: str = "lru"
    preemption_mode: str = "recompute"
    swap_space_gb: float = 1.0
    num_cpu_blocks: int | None = None
    host_tier_gb: float | None = None
    host_tier_blocks: int | None = None
    host_tier_write: str = "back"
    host_tier_link: Any = "pcie-gen5"  # a link spec name, or its values inline ({name, bandwidth_gbs, ...})


@dataclass
class SchedulerSchema:
    name: str = MISSING
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # the policy's own: checked against its signature


@dataclass
class PreemptingSchedulerSchema:
    """A policy that sets the cache's default preemption mode (scheduler=mlfq: swap)."""

    name: str = MISSING
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExecutorSchema:
    name: str = MISSING


@dataclass
class NullExecutorSchema(ExecutorSchema):
    step_time_s: float = 0.0


@dataclass
class SimExecutorSchema(ExecutorSchema):
    cost_model: str = "roofline"
    profile: str | None = None
    run: str | None = None
    spec_acceptance: float = 0.7
    allow_extrapolation: bool = False
    seed: int = 0
    tp_link: Any = None  # the parallel group's link: a spec sheet's values
    skip_steps: bool = True


@dataclass
class SpecSchema:
    method: str = MISSING


@dataclass
class LayerSkipSpecSchema(SpecSchema):
    num_speculative_tokens: int = 2
    num_layers: int = 24


@dataclass
class DraftSpecSchema(SpecSchema):
    num_speculative_tokens: int = 2
    model: str = "smollm2-135m"
    num_layers: int = 24


@dataclass
class NgramSpecSchema(SpecSchema):
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1


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
    repeat_seeds: list[Any] = field(default_factory=list)  # config keys: experiments.repeats names a bad one
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
class ParallelSchema:
    link: Any = None  # a link spec sheet's values (the link group, composed here)
    tensor_parallel_size: int = 1
    timeout_s: Any = 120  # seconds, int or float


@dataclass
class KernelSchema:
    name: str = MISSING


# group -> schema name -> schema; an option's yaml names one in its defaults
SCHEMAS: dict[str, dict[str, type]] = {
    "cache": {"paged": PagedCacheSchema, "static": CacheSchema},
    "scheduler": {"default": SchedulerSchema, "preempting": PreemptingSchedulerSchema},
    "executor": {"real": ExecutorSchema, "host": NullExecutorSchema, "sim": SimExecutorSchema},
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
