"""What host-device KV copies cost a simulated step (the host tier's loads and stores, swap's too when the
tier is on), priced by a link (testbed.cluster.links: conf/link/NAME.yaml; `cache.host_tier_link`).

A step's loads (host -> device) must land before its forward reads them: their time, bytes / bandwidth
plus the link's latency per batch of copies, is added to the step (the requests wait for it). Stores
(device -> host) run on a copy engine beside the forward (HiCache and vLLM's offloading connector copy on a
separate stream): only the part longer than the step's own time is added. Copies on the device (copy on
write) are not priced.
"""

from __future__ import annotations

from testbed.core.allocators.base import CopyKind


class HostCopyCost:
    def __init__(self, link, bytes_per_block: int):
        self.link = link
        self.bytes_per_block = bytes_per_block
        self.load_seconds = 0.0  # time steps waited for loads
        self.store_overflow_seconds = 0.0  # store time beyond the steps it overlapped
        self.bytes_to_device = 0
        self.bytes_to_host = 0

    def extra_time(self, copies, step_seconds: float) -> float:
        """Seconds the step takes longer because of its copies."""
        loads = sum(len(src) for src, _, kind in copies if kind is CopyKind.TO_DEVICE) * self.bytes_per_block
        stores = sum(len(src) for src, _, kind in copies if kind is CopyKind.TO_HOST) * self.bytes_per_block
        self.bytes_to_device += loads
        self.bytes_to_host += stores
        load = self.link.transfer_time(loads) if loads else 0.0
        store = max(0.0, self.link.transfer_time(stores) - step_seconds) if stores else 0.0
        self.load_seconds += load
        self.store_overflow_seconds += store
        return load + store


def host_copy_cost(tier, bytes_per_block: int) -> HostCopyCost | None:
    """The host tier's copies (tier: a HostTierConfig) priced over its link; None when it is off."""
    from testbed.cluster.links import load_link

    return HostCopyCost(load_link(tier.link), bytes_per_block) if tier.enabled else None
