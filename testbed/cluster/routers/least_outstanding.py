"""Fewest outstanding requests (join the shortest queue): SGLang router's shortest-queue fallback and
vLLM production-stack's session-less load balancing. Ties: fewest queued in the engine, then lowest index."""

from testbed.cluster.routers.base import Router, least_loaded


class LeastOutstandingRouter(Router):
    name = "least_outstanding"

    def choose(self, request, healthy, num_replicas):
        return least_loaded(healthy).index
