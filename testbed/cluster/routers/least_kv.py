"""Most free KV blocks (the replica whose cache has the most room: llm-d's kv-cache-utilization scorer).
Ties: fewest outstanding requests, then round robin."""

from testbed.cluster.routers.base import Router


class LeastKVRouter(Router):
    name = "least_kv"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.last = -1

    def choose(self, request, healthy, num_replicas):
        # free share, so replicas of different sizes compare fairly
        after = self.last

        def key(r):
            return -r.free_blocks / max(r.total_blocks, 1), r.outstanding, (r.index - after - 1) % num_replicas

        chosen = min(healthy, key=key)
        self.last = chosen.index
        return chosen.index
