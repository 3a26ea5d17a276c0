"""The router interface: given a request and a read-only view of every replica, pick one replica.

A router only chooses; the cluster (simulated, multi-process or HTTP) keeps the views current and counts
`outstanding` itself, as a real front end does for the requests it has sent and not yet seen finish.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class RouteRequest:
    request_id: str
    prompt_len: int
    # chained hashes of the prompt's leading full blocks (testbed.cluster.prefix), first block first:
    # equal hashes mean equal whole prefixes, as in the engine's prefix cache
    block_hashes: Sequence[int] = ()


class ReplicaView(Protocol):
    """What a router may read about one replica (nothing it can change: read-only properties)."""

    # position in the cluster's replica list: what route() returns
    @property
    def index(self) -> int: ...

    # routed here and not yet finished (the router side's own count)
    @property
    def outstanding(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    # KV blocks free (including evictable prefix-cache blocks)
    @property
    def free_blocks(self) -> int: ...

    @property
    def total_blocks(self) -> int: ...

    @property
    def healthy(self) -> bool: ...

    def is_cached(self, block_hash: int) -> bool:
        """Whether this replica's prefix cache holds the block with this chained hash."""
        ...


@dataclass
class ReplicaSnapshot:
    """A plain ReplicaView: fixed numbers and a set of cached block hashes (tests, HTTP backends)."""

    index: int
    outstanding: int = 0
    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    healthy: bool = True
    cached: Container[int] = field(default_factory=set)  # a set, or a RoutedPrefixes

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self.cached


class NoHealthyReplica(RuntimeError):
    """Every replica is marked unhealthy: the request cannot be placed."""


class Router:
    name = "base"
    # Whether route() reads replica state that moves with time: outstanding, running, waiting, free blocks,
    # cached blocks (False: only index and healthy, and the request). A simulated cluster routes the whole
    # arrival schedule of a router that does not ahead, so each replica runs to its own next arrival.
    # Every class says so itself: one that does not (a subclass may read what its parent did not) reads it.
    reads_replica_state = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "reads_replica_state" not in vars(cls):
            cls.reads_replica_state = True

    def __init__(self, seed: int = 0, **options):
        if options:
            raise ValueError(f"router {self.name!r} takes no options {sorted(options)}")
        self.seed = seed

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> int:
        """The index of the replica to send `request` to; only healthy replicas are candidates."""
        healthy = [r for r in replicas if r.healthy]
        if not healthy:
            raise NoHealthyReplica(f"request {request.request_id}: no healthy replica among {len(replicas)}")
        return self.choose(request, healthy, len(replicas))

    def choose(self, request: RouteRequest, healthy: list[ReplicaView], num_replicas: int) -> int:
        """Pick among the healthy replicas (non-empty, in index order); returns a ReplicaView.index."""
        raise NotImplementedError


def least_loaded(replicas: Sequence[ReplicaView], after: int, num_replicas: int) -> ReplicaView:
    """Fewest outstanding requests; ties: fewest queued in the engine, then in turn from the replica after
    `after` (NGINX least_conn tries tied servers round robin), so an idle cluster is not all replica 0."""
    return min(replicas, key=lambda r: (r.outstanding, r.running + r.waiting, (r.index - after - 1) % num_replicas))
