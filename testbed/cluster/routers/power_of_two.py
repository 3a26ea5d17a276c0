"""Power of two choices (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing", IEEE TPDS
2001): sample two distinct healthy replicas uniformly, send to the one with fewer outstanding requests
(ties: the first sampled). Near least-loaded balance from two looks instead of all N."""

import random

from testbed.cluster.routers.base import Router


class PowerOfTwoRouter(Router):
    name = "power_of_two"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.rng = random.Random(seed)

    def choose(self, request, healthy, num_replicas):
        if len(healthy) == 1:
            return healthy[0].index
        a, b = self.rng.sample(healthy, 2)
        return (b if b.outstanding < a.outstanding else a).index
