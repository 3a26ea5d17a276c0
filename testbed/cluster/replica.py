"""One simulated engine of a cluster, and the router's read-only view of it (a routers.base.ReplicaView)."""

from __future__ import annotations

from collections import deque

from testbed.outputs import RequestOutput


class SimReplica:
    """An Engine with its own scheduler, KV cache and virtual clock, plus what the cluster keeps about it:
    the requests routed here and not yet finished, and the outputs of the step in flight (delivered when
    that step ends on the cluster's time line)."""

    def __init__(self, index: int, engine, role: str = "mixed"):
        self.index = index
        self.engine = engine
        self.role = role  # mixed | prefill | decode
        self.outstanding = 0
        self.healthy = True
        self.busy = False  # a step is in flight: its end is on the cluster's event heap
        self.in_flight: list[RequestOutput] = []  # finished outputs of the step in flight
        self.num_routed = 0
        # when the requests routed here ahead (SimulatedCluster.plan_arrivals) will arrive, in order
        self.planned: deque[float] = deque()
        pool = engine.kv.pool  # paged allocators have a block pool with a prefix cache
        self._cached = pool.hash_to_block if pool is not None else {}

    # ---- the router's view: the engine's own state (it runs ahead by at most the step in flight) ----
    @property
    def running(self) -> int:
        return self.engine.scheduler.num_running

    @property
    def waiting(self) -> int:
        return self.engine.scheduler.num_waiting

    @property
    def free_blocks(self) -> int:
        return self.engine.kv.num_free_blocks

    @property
    def total_blocks(self) -> int:
        return self.engine.kv.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    # ---- time ------------------------------------------------------------------------------------
    def sync(self, now: float) -> None:
        """Bring this replica's clock to the cluster's time (an idle replica's clock stood still)."""
        clock = self.engine.clock
        if clock.now < now:
            clock.advance(now - clock.now)

    def __repr__(self) -> str:
        return f"SimReplica({self.index}, {self.role}, outstanding={self.outstanding}, busy={self.busy})"
