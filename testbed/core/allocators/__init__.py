"""KV allocators (`cache=`): the paged block pool and the static contiguous baselines.

Each is a KVAllocator (testbed.core.allocators.base), so the scheduler, executor and the memory
accounting treat them alike; a new allocator is one class plus one line here.
"""

import inspect
from typing import Any

from testbed.core.allocators.base import KVAllocator
from testbed.plugins import load_class

# name -> "module:Class"; a name may also be the import path of the user's own KVAllocator (testbed.plugins),
# built with the keywords it declares among num_blocks, block_size, enable_prefix_caching, eviction, max_model_len
ALLOCATORS = {
    "paged": "testbed.core.allocators.paged:PagedAllocator",
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
    cls: type[Any] = load_class("cache (KV allocator)", ALLOCATORS, name, KVAllocator)  # constructors differ
    if name == "paged":
        return cls(num_blocks, block_size, enable_prefix_caching, eviction)
    if name in ALLOCATORS:
        return cls(num_blocks, block_size, max_model_len)
    given = dict(
        num_blocks=num_blocks,
        block_size=block_size,
        enable_prefix_caching=enable_prefix_caching,
        eviction=eviction,
        max_model_len=max_model_len,
    )
    declared = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in given.items() if k in declared})
