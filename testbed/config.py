"""Everything needed to assemble an engine, as one flat, validated dataclass (Hydra maps onto it)."""

from dataclasses import dataclass, field, fields

from testbed.typecheck import check_field_types
from testbed.validation import check_engine_config


@dataclass
class EngineConfig:
    model: str = "smollm2-135m"  # built-in model or shape (testbed/specs/model/), or an HF folder path
    hf_config: dict | None = None  # values over the model's config.json / built-in shape (vLLM's hf_overrides)
    tokenizer: str | None = None  # another model's tokenizer (built-in name or HF folder); None: the model's
    kernel: str = "auto"  # attention/layer kernels: auto | torch | triton | cpu (auto: fastest that works here)
    scheduler: str = "fcfs"  # policy name (testbed.core.policies)
    scheduler_options: dict = field(default_factory=dict)
    cache: str = "paged"  # KV allocator (testbed.core.allocators): paged | static_max | static_pow2 | static_oracle
    eviction: str = "lru"  # prefix-cache eviction (testbed.core.eviction): lru | lfu | workload
    preemption_mode: str = "recompute"  # recompute | swap (KV blocks to a host pool and back)
    swap_space_gb: float = 1.0  # host pool for swap preemption
    num_cpu_blocks: int | None = None  # overrides swap_space_gb when set
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from kv_cache_memory_gb (CPU) or free GPU memory
    kv_cache_memory_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on GPU
    kv_cache_dtype: str = "auto"  # auto (= dtype) | float32 | bfloat16 | float16; attention accumulates in fp32
    device: str | None = None  # None: cuda if available
    seed: int = 0
    speculative_config: dict | None = None  # vLLM's spelling: {"method": "ngram"|"draft"|"layerskip", ...}
    enforce_eager: bool = False  # True: no CUDA graphs (decode graphs need CUDA and kernel=triton)
    cuda_graph_sizes: list[int] | None = None  # decode batch sizes to capture; None: 1,2,4,8,16,...,max_num_seqs
    cuda_graph_dry_run: bool = False  # the graph path (static buffers, padding) run eagerly, any device: tests
    async_scheduling: bool | None = None  # schedule step N+1 while step N runs; None: on CUDA (see Engine)
    host_step_time_s: float = 0.0  # executor=host: hold the "device" this long per step (overlap benchmarks)
    # testbed.executor_kinds: real (the model) | host (no model: host-side cost) | sim (a cost model, virtual
    # clock) | the import path of an ExecutorKind subclass (module:Class)
    executor: str = "real"
    sim_config: dict | None = None  # executor=sim: testbed.sim.config.SimConfig fields (cost_model, device: a
    # built-in name or the spec sheet's values, ...)
    host_tier: dict | None = None  # host-memory KV tier: testbed.core.host_tier.HostTierConfig fields (gb, write, ...)
    tensor_parallel_size: int = 1  # ranks one model is split over (testbed.parallel); KV budgets are per rank
    distributed_timeout_s: float = 120.0  # TP: a collective not done by then fails the engine (dead or hung rank)
    # grammar compile limits and cache: testbed.structured.limits.StructuredOutputsConfig fields
    structured_outputs_config: dict | None = None

    def __post_init__(self):
        check_field_types(self)
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 1:
            raise ValueError(f"num_cpu_blocks must be >= 1, got {self.num_cpu_blocks}")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        if self.hf_config is not None and not isinstance(self.hf_config, dict):
            raise ValueError(f"hf_config must be a mapping of config.json keys, got {self.hf_config!r}")
        from testbed.parallel.config import check_parallel_config

        check_parallel_config(self)
        if self.kv_cache_dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError(f"kv_cache_dtype must be auto, float32, float16 or bfloat16, got {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype != "auto" and self.kernel == "triton":
            raise ValueError("kv_cache_dtype other than auto runs with kernel=torch or kernel=cpu, not triton")
        if self.cuda_graph_sizes is not None and (not self.cuda_graph_sizes or min(self.cuda_graph_sizes) < 1):
            raise ValueError(f"cuda_graph_sizes must be positive batch sizes, got {self.cuda_graph_sizes}")
        from testbed.core.host_tier import HostTierConfig

        HostTierConfig.from_any(self.host_tier)  # validate early
        from testbed.spec.config import SpeculativeConfig

        SpeculativeConfig.from_any(self.speculative_config)  # validate early
        from testbed.structured.limits import StructuredOutputsConfig

        StructuredOutputsConfig.from_any(self.structured_outputs_config)  # validate early
        check_engine_config(self)  # max_model_len, kv_cache_memory_gb
        from testbed.executor_kinds import executor_kind

        executor_kind(self.executor).check_config(self)  # what this kind cannot run (validates sim_config)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine options {unknown}; known: {sorted(names)}")
        return cls(**kwargs)
