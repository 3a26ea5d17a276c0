"""A cost model's prices times a constant: `executor.cost_scale` (default 1, no wrapper).

What-if: a device X% slower is cost_scale = 1 + X/100. The fidelity study's drift matching
(experiments/studies/fidelity_drift.py) sets it to a real run's probe time over the calibration's, so the
simulation runs at the speed the machine measured before that run. Only the model's step price is scaled;
host-tier KV copies are priced by their link (testbed.sim.host_copies), not by the device's speed.
"""

from testbed.sim.cost_models.base import CostModel


class ScaledCost(CostModel):
    def __init__(self, inner: CostModel, scale: float):
        self.inner, self.scale = inner, scale
        self.tensor_parallel = inner.tensor_parallel

    @property
    def identity(self) -> dict:
        return {**self.inner.identity, "cost_scale": self.scale}

    def step_time(self, shape) -> float:
        return self.scale * self.inner.step_time(shape)

    def decode_step_times(self, num_seqs: int, first_context: int, count: int) -> list[float]:
        return [self.scale * t for t in self.inner.decode_step_times(num_seqs, first_context, count)]
