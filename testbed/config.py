"""Everything needed to assemble an engine, as one flat, validated dataclass (Hydra maps onto it)."""
from dataclasses import dataclass, field, fields


@dataclass
class EngineConfig:
    model: str = "smollm2-135m"          # built-in name, conf/model shape name, or HF folder path
    kernel: str = "torch"                # attention/layer kernels: torch | triton
    scheduler: str = "fcfs"              # policy name (testbed.core.policies)
    scheduler_options: dict = field(default_factory=dict)
    block_size: int = 16
    num_blocks: int | None = None        # None: sized from kv_cache_memory_gb (CPU) or free GPU memory
    kv_cache_memory_gb: float = 1.0
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None     # None: the model's max_position_embeddings
    dtype: str | None = None             # None: float32 on CPU, bfloat16 on GPU
    device: str | None = None            # None: cuda if available
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")

    @classmethod
    def from_kwargs(cls, **kwargs) -> "EngineConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine options {unknown}; known: {sorted(names)}")
        return cls(**kwargs)
