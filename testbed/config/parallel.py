"""The parallel group: tensor parallelism's ranks and its collectives' deadline (testbed.parallel)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.fields import flat
from testbed.typecheck import check_field_types


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1  # ranks one model is split over (testbed.parallel); KV budgets are per rank
    # a collective not done by then fails the engine (dead or hung rank); seconds, an int stays an int
    timeout_s: int | float = flat("distributed_timeout_s", 120)

    def __post_init__(self):
        check_field_types(self)
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
