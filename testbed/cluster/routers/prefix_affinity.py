"""Prefix affinity: consistent hashing with bounded loads on the request's leading blocks.

Follows "Consistent Hashing with Bounded Loads" (Mirrokni, Thorup and Zadimoghaddam, SODA 2018): each
replica owns `vnodes` points on a hash ring; a request's key (the chained hash of its first `key_blocks`
full blocks, i.e. of its leading `key_blocks * block_size` tokens) lands on the ring and goes to the first
replica clockwise whose load is under the bound ceil(load_factor * (total load + 1) / healthy replicas),
load being the replica's outstanding requests. Requests sharing a leading prefix so share a home replica
(its prefix cache serves them), the bound spills a hot prefix to the next replicas on the ring instead of
overloading its home, and a replica leaving or joining moves only the keys it owns.

`cache_aware` (default on) adds the idea of SGLang's cache-aware router (sgl-router
src/policies/cache_aware.rs): among the replicas within the bound, the one holding the longest cached
prefix of the request wins (ring order breaks ties, so with nothing cached anywhere it is plain bounded
consistent hashing).

Where this deviates from SGLang's router: SGLang keeps an approximate radix tree of the text it routed to
each worker, sends a request to the best-matching worker when the match exceeds cache_threshold (else to
the worker with the smallest tree), and switches to shortest-queue routing whenever loads are imbalanced
(max - min > balance_abs_threshold and max > balance_rel_threshold * min). Here the cold-cache choice is
the consistent-hashing home instead of the smallest tree, the load rule is Mirrokni's bound instead of
the two imbalance thresholds, and the match is read from the replica's view (`is_cached`: the real
prefix cache in the simulator, an approximate record of routed prefixes where a router cannot see the
cache). The longest cached prefix is found by bisection, which is exact when a replica's cached blocks of
a chain form a prefix of it (the block pool frees a request's blocks tail first, so it evicts them in
that order); requests without a full block go to the least-loaded replica.
"""

import bisect
import hashlib
import math

from testbed.cluster.routers.base import Router, least_loaded

MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit position for a (possibly negative) Python hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def ring_point(replica: int, vnode: int) -> int:
    digest = hashlib.blake2b(f"{replica}:{vnode}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class HashRing:
    """`vnodes` points per replica; order(key) lists every replica in clockwise order from the key."""

    def __init__(self, num_replicas: int, vnodes: int):
        points = sorted((ring_point(r, v), r) for r in range(num_replicas) for v in range(vnodes))
        self.positions = [p for p, _ in points]
        self.owners = [r for _, r in points]
        self.num_replicas = num_replicas
        self._orders: dict[int, tuple[int, ...]] = {}  # start point -> distinct replicas clockwise

    def order(self, key: int) -> tuple[int, ...]:
        start = bisect.bisect(self.positions, mix64(key)) % len(self.positions)
        order = self._orders.get(start)
        if order is None:
            seen: dict[int, None] = {}
            n = len(self.owners)
            for i in range(n):
                seen.setdefault(self.owners[(start + i) % n])
                if len(seen) == self.num_replicas:
                    break
            order = self._orders[start] = tuple(seen)
        return order


def cached_prefix_blocks(replica, block_hashes) -> int:
    """How many leading blocks `replica` has cached, by bisection (see the module docstring)."""
    if not block_hashes or not replica.is_cached(block_hashes[0]):
        return 0
    lo, hi = 1, len(block_hashes)  # block_hashes[lo - 1] cached; find the last cached
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if replica.is_cached(block_hashes[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixAffinityRouter(Router):
    name = "prefix_affinity"

    def __init__(
        self, seed: int = 0, key_blocks: int = 4, load_factor: float = 1.25, vnodes: int = 64, cache_aware: bool = True
    ):
        super().__init__(seed)
        if not isinstance(key_blocks, int) or key_blocks < 1:
            raise ValueError(f"prefix_affinity key_blocks must be an integer >= 1, got {key_blocks!r}")
        if not load_factor >= 1:
            raise ValueError(f"prefix_affinity load_factor must be >= 1 (Mirrokni et al.'s c), got {load_factor!r}")
        if not isinstance(vnodes, int) or vnodes < 1:
            raise ValueError(f"prefix_affinity vnodes must be an integer >= 1, got {vnodes!r}")
        self.key_blocks, self.load_factor, self.vnodes, self.cache_aware = key_blocks, load_factor, vnodes, cache_aware
        self.ring: HashRing | None = None
        self.last = -1  # the last replica a request without blocks went to (ties in turn)

    def choose(self, request, healthy, num_replicas):
        hashes = request.block_hashes
        if not hashes:
            self.last = least_loaded(healthy, self.last, num_replicas).index
            return self.last
        if self.ring is None or self.ring.num_replicas != num_replicas:
            self.ring = HashRing(num_replicas, self.vnodes)
        by_index = {r.index: r for r in healthy}
        bound = math.ceil(self.load_factor * (sum(r.outstanding for r in healthy) + 1) / len(healthy))
        key = hashes[min(self.key_blocks, len(hashes)) - 1]
        # non-empty: the outstanding total is below len(healthy) * bound
        within = [by_index[i] for i in self.ring.order(key) if i in by_index and by_index[i].outstanding < bound]
        if self.cache_aware:
            best = max(within, key=lambda r: cached_prefix_blocks(r, hashes))  # first in ring order on ties
            if cached_prefix_blocks(best, hashes):
                return best.index
        return within[0].index
