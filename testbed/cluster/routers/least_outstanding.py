"""Fewest outstanding requests (join the shortest queue): SGLang router's shortest-queue fallback, NGINX's
least_conn. Ties: fewest queued in the engine, then round robin (as NGINX least_conn)."""

from testbed.cluster.routers.base import Router, least_loaded


class LeastOutstandingRouter(Router):
    name = "least_outstanding"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.last = -1

    def choose(self, request, healthy, num_replicas):
        self.last = least_loaded(healthy, self.last, num_replicas).index
        return self.last
