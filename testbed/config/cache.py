"""The cache group: the KV allocator, its capacity, prefix caching, preemption's host pool and the host tier."""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.config.fields import flat
from testbed.core.host_tier import HostTierConfig
from testbed.typecheck import check_field_types
from testbed.validation import is_real

KV_DTYPES = ("auto", "float32", "float16", "bfloat16")
PREEMPTION_MODES = ("recompute", "swap")


@dataclass
class CacheConfig:
    # KV allocator (testbed.core.allocators): paged | static_max | static_pow2 | static_oracle | ... | module:Class
    name: str = flat("cache", "paged")
    block_size: int = 16
    num_blocks: int | None = None  # None: sized from memory_gb (CPU) or free GPU memory
    memory_gb: float = flat("kv_cache_memory_gb", 1.0)
    dtype: str = flat("kv_cache_dtype", "auto")  # auto (= the model's) | float32 | bfloat16 | float16
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool = flat("enable_prefix_caching", True)
    eviction: str = "lru"  # prefix-cache eviction (testbed.core.eviction): lru | lfu | workload
    preemption_mode: str = "recompute"  # recompute | swap (KV blocks to a host pool and back)
    swap_space_gb: float = 1.0  # host pool for swap preemption
    num_cpu_blocks: int | None = None  # overrides swap_space_gb when set
    host_tier: HostTierConfig = flat("host_tier", default_factory=HostTierConfig)  # a mapping of its fields too

    def __post_init__(self):
        self.host_tier = HostTierConfig.from_any(self.host_tier)
        check_field_types(self)
        if not 1 <= self.block_size <= 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {self.num_blocks}")
        gb = self.memory_gb
        if not is_real(gb) or not 0 < gb < math.inf:
            raise ValueError(f"memory_gb must be a finite number > 0, got {gb!r}")
        if self.dtype not in KV_DTYPES:
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 1:
            raise ValueError(f"num_cpu_blocks must be >= 1, got {self.num_cpu_blocks}")
