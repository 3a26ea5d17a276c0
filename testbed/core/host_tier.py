"""A host-memory tier under the device prefix cache (`cache.host_tier_gb`, off by default).

Blocks the device pool evicts keep their contents in a host pool with its own LRU eviction; a prefix
lookup that runs out of device hits continues in the host tier, and the blocks found there are loaded back
into device blocks before the request runs (they then count as cached tokens). Two ways of filling it:

    back     write-back: a block is copied to the host when the device pool evicts it (SGLang HiCache's
             `write_back` policy); nothing moves for blocks that are never evicted
    through  write-through: every cached block is copied to the host when its last holder releases it
             (LMCache and vLLM's CPU offloading connector store a request's KV as it completes; HiCache's
             `write_through` backs up on insertion); an eviction then costs no copy

Copies go through the allocator's copy log (`record_copy`, as swap preemption's): the executor runs them,
in order, before the next forward, which is early enough: a device block is overwritten only in a
forward, and a write-through copy is recorded when the block's last forward is done. A load takes fresh
device blocks (evicting, and in write-back storing, LRU blocks of the device pool), registers them under
their hashes and releases them as cached blocks, so the lookup then finds them as ordinary prefix hits.
The host entries being loaded are pinned against the stores that loading causes.

Deviations: the host pool is one LRU (HiCache and LMCache also offer others); loads are whole blocks
before the step, not layer by layer overlapped with the forward (HiCache's layer-wise load); a load is
made when a waiting request is looked up, which may be before it can be admitted (the loaded blocks then
wait as ordinary cached blocks).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

from testbed.core.allocators.base import CopyKind

WRITE_POLICIES = ("back", "through")


@dataclass
class HostTierConfig:
    gb: float | None = None  # host memory for the tier; None: `blocks` or off
    blocks: int | None = None  # overrides gb when set
    write: str = "back"  # back | through (see above)
    link: str | dict = "pcie-gen5"  # what the simulator prices copies with: a link's name or its values

    def __post_init__(self):
        if self.write not in WRITE_POLICIES:
            raise ValueError(f"cache.host_tier_write must be one of {list(WRITE_POLICIES)}, got {self.write!r}")
        if self.gb is not None and (isinstance(self.gb, bool) or not self.gb > 0):
            raise ValueError(f"cache.host_tier_gb must be null or > 0, got {self.gb!r}")
        bad_blocks = isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 1
        if self.blocks is not None and bad_blocks:
            raise ValueError(f"cache.host_tier_blocks must be null or an integer >= 1, got {self.blocks!r}")

    @property
    def enabled(self) -> bool:
        return self.gb is not None or self.blocks is not None

    @classmethod
    def from_any(cls, value) -> HostTierConfig:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown host tier keys {unknown}; known: {sorted(names)}")
        return cls(**{k: v for k, v in value.items() if v is not None})

    def num_blocks(self, bytes_per_block: int) -> int:
        if self.blocks is not None:
            return self.blocks
        n = int((self.gb or 0) * 2**30 // bytes_per_block)
        if n < 1:
            raise ValueError(f"cache.host_tier_gb={self.gb} holds no KV block of {bytes_per_block} bytes")
        return n


class HostKVTier:
    """Host block ids first_id .. first_id + num_blocks - 1 of the executor's host pool (after swap's)."""

    def __init__(self, kv, num_blocks: int, first_id: int = 0, write: str = "back"):
        if write not in WRITE_POLICIES:
            raise ValueError(f"host tier write policy must be one of {list(WRITE_POLICIES)}, got {write!r}")
        self.kv = kv
        self.num_blocks = num_blocks
        self.write = write
        self.entries: OrderedDict[int, int] = OrderedDict()  # block hash -> host block id, LRU first
        self.free_ids = list(range(first_id + num_blocks - 1, first_id - 1, -1))
        self.pinned: set[int] = set()
        self.loaded_for: dict[str, int] = {}  # request id -> blocks loaded on its lookups, not yet counted
        self.blocks_stored = 0
        self.blocks_loaded = 0
        self.evictions = 0
        kv.pool.on_evict = self._on_device_evict

    # ---- stores -----------------------------------------------------------------------------------
    def _store(self, block) -> None:
        h = block.block_hash
        if h in self.entries:
            self.entries.move_to_end(h)
            return
        if not self.free_ids:
            victim = next((v for v in self.entries if v not in self.pinned), None)
            if victim is None:
                return  # every entry is being loaded: this block is not kept
            self.free_ids.append(self.entries.pop(victim))
            self.evictions += 1
        host_id = self.free_ids.pop()
        self.entries[h] = host_id
        self.kv.record_copy([block.block_id], [host_id], CopyKind.TO_HOST)
        self.blocks_stored += 1

    def _on_device_evict(self, block) -> None:
        if self.write == "back" or block.block_hash not in self.entries:
            self._store(block)  # write-through stores on release; one evicted before that is stored now

    def on_release(self, blocks) -> None:
        """A request let go of its blocks (write-through: store the cached ones now free)."""
        if self.write == "through":
            for block in blocks:
                if block.ref_cnt == 0 and block.block_hash is not None:
                    self._store(block)

    # ---- loads ------------------------------------------------------------------------------------
    def load(self, request_id: str, hashes, device_hits: list) -> list:
        """Device blocks holding the host entries of `hashes` (the lookup's next prefix blocks, after the
        device hits) up to the first not on the host, loaded back; [] if none. device_hits are held while
        the pool makes room, so loading cannot evict them."""
        run = []
        for h in hashes:
            if h not in self.entries:
                break
            run.append(h)
        pool = self.kv.pool
        reserve = sum(1 for b in device_hits if b.ref_cnt == 0)
        run = run[: max(0, pool.num_free_blocks - reserve)]
        if not run:
            return []
        self.pinned.update(run)
        pool.touch(device_hits)
        for b in device_hits:
            b.hit_count -= 1  # held only while loading: not a hit
        blocks = pool.get_new_blocks(len(run))
        host_ids = [self.entries[h] for h in run]
        for h in run:
            self.entries.move_to_end(h)
        for i, (block, h) in enumerate(zip(blocks, run)):
            pool.cache_block(block, h, len(device_hits) + i)
        self.kv.record_copy(host_ids, [b.block_id for b in blocks], CopyKind.TO_DEVICE)
        pool.free_blocks(reversed(device_hits + blocks))  # tail first, as a request frees its blocks
        self.pinned.clear()
        self.blocks_loaded += len(run)
        self.loaded_for[request_id] = self.loaded_for.get(request_id, 0) + len(run)
        return blocks

    def take_loaded(self, request_id: str) -> int:
        return self.loaded_for.pop(request_id, 0)

    def check_invariants(self) -> None:
        ids = list(self.entries.values()) + self.free_ids
        assert len(ids) == len(set(ids)) == self.num_blocks, "every host block is an entry or free, once"


def attach_host_tier(config, kv, num_cpu_blocks: int | None, bytes_per_block: int) -> int | None:
    """Give the engine's allocator a host tier if config.host_tier asks for one (config: a CacheConfig);
    returns the host pool's size for the executor (swap's blocks first, then the tier's)."""
    tier = config.host_tier
    if not tier.enabled:
        return num_cpu_blocks
    if not kv.supports_host_tier or not config.prefix_caching:
        raise ValueError("cache.host_tier_gb needs the paged cache with prefix caching on (cache=paged)")
    n = tier.num_blocks(bytes_per_block)
    first = num_cpu_blocks or 0
    kv.host_tier = HostKVTier(kv, n, first, tier.write)
    return first + n
