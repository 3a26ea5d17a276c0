"""Most free KV blocks (the replica whose cache has the most room: llm-d's kv-cache-utilization scorer).
Ties: fewest outstanding requests, then lowest index."""

from testbed.cluster.routers.base import Router


class LeastKVRouter(Router):
    name = "least_kv"

    def choose(self, request, healthy, num_replicas):
        # free share, so replicas of different sizes compare fairly
        return min(healthy, key=lambda r: (-r.free_blocks / max(r.total_blocks, 1), r.outstanding, r.index)).index
