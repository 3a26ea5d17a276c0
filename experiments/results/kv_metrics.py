"""The prefix cache's device / host / miss split and the host tier's traffic, as summary.json keys.

kv_device_hit_tokens, kv_host_hit_tokens, kv_miss_tokens: prompt tokens at first scheduling served from
the device cache, loaded from the host tier, computed (they sum to the prompt tokens looked up). With the
host tier (cache.host_tier_gb): kv_host_blocks_stored / _loaded, kv_host_evictions, kv_bytes_to_host /
kv_bytes_to_device, and kv_host_load_wait_s: time steps waited for loads (simulated: priced by the link,
testbed.sim.host_copies; real: host time in the copier's host-to-device copies, which run before the forward
that needs them), plus kv_host_store_s (real: host time of the stores; simulated: store time beyond the
steps it overlapped).
"""

from __future__ import annotations

from testbed.core.allocators.base import CopyKind


def kv_reuse_summary(engine) -> dict:
    kv = engine.kv
    queries, hits = getattr(kv, "prefix_queries", 0), getattr(kv, "prefix_hits", 0)
    host = getattr(kv, "host_hits", 0)
    out = {"kv_device_hit_tokens": hits - host, "kv_host_hit_tokens": host, "kv_miss_tokens": queries - hits}
    tier = getattr(kv, "host_tier", None)
    if tier is None:
        return out
    per_block = engine.arch.kv_bytes_per_token(engine.kv_dtype.itemsize) * kv.block_size
    out.update(
        kv_host_tier_blocks=tier.num_blocks,
        kv_host_write=tier.write,
        kv_host_blocks_stored=tier.blocks_stored,
        kv_host_blocks_loaded=tier.blocks_loaded,
        kv_host_evictions=tier.evictions,
        kv_bytes_to_host=tier.blocks_stored * per_block,
        kv_bytes_to_device=tier.blocks_loaded * per_block,
    )
    cost = getattr(engine.executor, "copy_cost", None)
    copier = getattr(engine.executor, "copier", None)
    if cost is not None:
        out.update(kv_host_load_wait_s=cost.load_seconds, kv_host_store_s=cost.store_overflow_seconds)
    elif copier is not None:
        out.update(
            kv_host_load_wait_s=copier.seconds[CopyKind.TO_DEVICE], kv_host_store_s=copier.seconds[CopyKind.TO_HOST]
        )
    return out
