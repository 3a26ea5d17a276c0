"""The KV tensors: sizing them from memory, allocating them, and copying blocks (swap preemption to and from
a host pool; copy on write within the device cache for parallel sampling).

Per layer a (k, v) pair of [num_blocks, block_size, num_kv_heads, head_dim]; slot s is block s // block_size,
offset s % block_size.
"""

import time

import torch

from testbed.core.allocators.base import CopyKind, KVCopy
from testbed.executor.host_memory import zeros_on_huge_pages


def kv_cache_dtype(cache, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type: cache.dtype (a CacheConfig), or the model's dtype for "auto"."""
    return dtype if cache.dtype == "auto" else getattr(torch, cache.dtype)


def kv_bytes_per_block(arch, dtype: torch.dtype, block_size: int) -> int:
    return arch.kv_bytes_per_token(dtype.itemsize) * block_size


def num_blocks_from_memory(
    arch,
    dtype: torch.dtype,
    block_size: int,
    device: torch.device,
    kv_cache_memory_gb: float,
    gpu_memory_utilization: float,
) -> int:
    """Blocks that fit the KV budget: a share of free GPU memory on CUDA, kv_cache_memory_gb elsewhere."""
    per_block = kv_bytes_per_block(arch, dtype, block_size)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = free - total * (1 - gpu_memory_utilization)
    else:
        budget = kv_cache_memory_gb * 2**30
    num_blocks = int(budget // per_block)
    if num_blocks < 1:
        raise ValueError(f"KV-cache budget of {budget / 2**30:.3f} GiB holds no block of {per_block} bytes")
    return num_blocks


def num_host_blocks(arch, dtype: torch.dtype, block_size: int, swap_space_gb: float) -> int:
    """Blocks of the host pool for swap preemption, sized like the device cache from swap_space_gb."""
    return max(1, int(swap_space_gb * 2**30 // kv_bytes_per_block(arch, dtype, block_size)))


def allocate_kv_cache(arch, num_blocks: int, block_size: int, num_layers: int, dtype, device) -> list:
    """(k, v) zero tensors [num_blocks, block_size, kv_heads, head_dim] per layer; on the host, on 2 MiB pages
    (host_memory.zeros_on_huge_pages)."""
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    if torch.device(device).type == "cpu":
        return [(zeros_on_huge_pages(shape, dtype), zeros_on_huge_pages(shape, dtype)) for _ in range(num_layers)]
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]


def copy_kv_blocks(device_caches, host_caches, src: list[int], dst: list[int], to_host: bool) -> None:
    """KV blocks src -> dst, device -> host pool (to_host) or back, every layer."""
    src_ids, dst_ids = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)
    for device_kv, host_kv in zip(device_caches, host_caches):
        for dev, host in zip(device_kv, host_kv):
            if to_host:
                host[dst_ids] = dev[src_ids.to(dev.device)].to("cpu")
            else:
                dev[dst_ids.to(dev.device)] = host[src_ids].to(dev.device)


def copy_device_blocks(device_caches, src: list[int], dst: list[int]) -> None:
    """KV blocks src -> dst within the device cache, every layer (copy on write)."""
    for device_kv in device_caches:
        for dev in device_kv:
            src_ids = torch.tensor(src, dtype=torch.long, device=dev.device)
            dev[torch.tensor(dst, dtype=torch.long, device=dev.device)] = dev[src_ids]


class KVBlockCopier:
    """Runs a SchedulerOutput's block copies, in order, over every (device caches, host pool) pair: the
    target model's and, with a draft model, the draft's (its KV lives in the same block ids). The host pool is
    None without swap preemption (then only copies on the device come)."""

    def __init__(self, pairs: list[tuple[list, list | None]]):
        self.pairs = pairs
        self.seconds = {kind: 0.0 for kind in CopyKind}  # host time spent per kind of copy (the host tier's metrics)

    @torch.inference_mode()
    def run(self, copies: list[KVCopy]) -> None:
        for src, dst, kind in _coalesced(copies):
            start = time.perf_counter()
            for device_caches, host_caches in self.pairs:
                if kind is CopyKind.ON_DEVICE:
                    copy_device_blocks(device_caches, src, dst)
                else:
                    copy_kv_blocks(device_caches, host_caches, src, dst, kind is CopyKind.TO_HOST)
            self.seconds[kind] += time.perf_counter() - start


def _coalesced(copies: list[KVCopy]) -> list[KVCopy]:
    """Runs of consecutive copies on the device merged into one (one gather and scatter per tensor): within a
    step a copy-on-write destination is a fresh block, never another copy's source, so order inside a run
    does not matter. Swap copies stay as they are, in order."""
    out: list[KVCopy] = []
    for src, dst, kind in copies:
        if kind is CopyKind.ON_DEVICE and out and out[-1][2] is CopyKind.ON_DEVICE:
            out[-1] = (out[-1][0] + src, out[-1][1] + dst, kind)
        else:
            out.append((list(src), list(dst), kind))
    return out
