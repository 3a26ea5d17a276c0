"""Uniformly random among healthy replicas (seeded: a run is reproducible)."""

import random

from testbed.cluster.routers.base import Router


class RandomRouter(Router):
    name = "random"
    reads_replica_state = False  # the choice depends on the order of requests only

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.rng = random.Random(seed)

    def choose(self, request, healthy, num_replicas):
        return healthy[self.rng.randrange(len(healthy))].index
