"""What a cost model is: the price of one step from its shape, built from what the simulation knows.

A registry name (testbed.sim.cost_models.COST_MODELS) or the import path of the user's own subclass
(`executor.cost_model=mylab.cost:Mine`) selects one; options come from executor.cost_model_options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from testbed.sim.devices import DeviceSpec
from testbed.sim.shape import StepShape


@dataclass(frozen=True)
class CostContext:
    """What the simulation hands a cost model when it builds one."""

    arch: Any  # the model's shape (one rank's share under tensor parallelism)
    dtype: torch.dtype
    device: DeviceSpec | None  # the device group's spec sheet, when one is composed
    profile: str | None  # executor.profile
    model: str  # the model's name
    kernel: str
    max_num_seqs: int
    max_num_batched_tokens: int
    allow_extrapolation: bool


class CostModel:
    name = "base"
    # where the KV capacity comes from: "device" (its memory after the weights; the model then needs a device
    # spec sheet) or "budget" (cache.memory_gb)
    kv_capacity = "budget"
    # how it prices one rank of a tensor-parallel group (testbed.parallel.sim_cost): "rank" (built from the
    # rank's own share of the shape), "scaled" (the whole model's cost scaled by 1/N past its fixed terms);
    # None: it does not price tensor parallelism
    tensor_parallel: str | None = None

    @classmethod
    def resolve(cls, sim, dtype: str | None, kernel: str) -> tuple[str, str]:
        """(dtype, kernel) of the run, checking the inputs this model reads exist before anything is built."""
        return dtype or "bfloat16", kernel

    @classmethod
    def build(cls, ctx: CostContext, **options) -> CostModel:
        """A user's model gets only its options (executor.cost_model_options); built-ins read ctx."""
        return cls(**options)

    @classmethod
    def options_target(cls):
        """What the options are checked against: the constructor, unless build() is overridden."""
        return cls if cls.build.__func__ is CostModel.build.__func__ else cls.build  # type: ignore[attr-defined]

    @property
    def identity(self) -> dict:
        return {"cost_model": self.name}

    def step_time(self, shape: StepShape) -> float:
        raise NotImplementedError

    def decode_step_times(self, num_seqs: int, first_context: int, count: int) -> list[float]:
        """step_time of `count` consecutive pure decode steps of num_seqs requests, one token each: the
        first attends to first_context KV tokens, each later one to num_seqs more (a decode run,
        testbed.sim.decode_runs). A model may price them at once; the prices must equal step_time's."""
        n = num_seqs
        return [self.step_time(StepShape(n, n, n, 0, 0, 0.0, 0, n, n, first_context + i * n)) for i in range(count)]
