"""KV allocators (`cache=`): the paged block pool and the static contiguous baselines.

Each is a KVAllocator (testbed.core.allocators.base), so the scheduler, executor and the memory
accounting treat them alike; a new allocator is one class plus one line here.
"""

import importlib

ALLOCATORS = {
    "paged": "testbed.core.kv_cache_manager:KVCacheManager",
    "static_max": "testbed.core.allocators.contiguous:StaticMaxAllocator",
    "static_pow2": "testbed.core.allocators.contiguous:StaticPow2Allocator",
    "static_oracle": "testbed.core.allocators.contiguous:StaticOracleAllocator",
    "static_pow2_total": "testbed.core.allocators.contiguous:StaticPow2TotalAllocator",
    "static_max_buddy": "testbed.core.allocators.contiguous:StaticMaxBuddyAllocator",
    "static_pow2_buddy": "testbed.core.allocators.contiguous:StaticPow2BuddyAllocator",
    "static_oracle_buddy": "testbed.core.allocators.contiguous:StaticOracleBuddyAllocator",
}


def get_allocator(
    name: str,
    num_blocks: int,
    block_size: int,
    *,
    enable_prefix_caching: bool = True,
    eviction: str = "lru",
    max_model_len: int,
):
    if name not in ALLOCATORS:
        raise ValueError(f"unknown cache (KV allocator) {name!r}; choose one of {sorted(ALLOCATORS)}")
    module, cls = ALLOCATORS[name].split(":")
    cls = getattr(importlib.import_module(module), cls)
    if name == "paged":
        return cls(num_blocks, block_size, enable_prefix_caching, eviction)
    return cls(num_blocks, block_size, max_model_len)
