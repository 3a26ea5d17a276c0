"""Round robin: replicas in turn, skipping unhealthy ones (SGLang's and vLLM's production-stack default)."""

from testbed.cluster.routers.base import Router


class RoundRobinRouter(Router):
    name = "round_robin"
    reads_replica_state = False  # the choice depends on the order of requests only

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.last = -1

    def choose(self, request, healthy, num_replicas):
        # the first healthy replica after the last one chosen, so a replica coming back rejoins its turn
        after = [r for r in healthy if r.index > self.last]
        chosen = (after or healthy)[0]
        self.last = chosen.index
        return chosen.index
