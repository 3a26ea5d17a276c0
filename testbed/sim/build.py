"""Assemble a simulation: its clock, device and dtype, its KV capacity, and the simulated executor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from testbed.cluster.links import load_link
from testbed.parallel.sim_cost import rank_arch
from testbed.sim.clock import ReplayClock, VirtualClock
from testbed.sim.config import SimConfig
from testbed.sim.cost_models import REPLAY_STEPS, CostContext, build_cost_model, cost_model_class
from testbed.sim.devices import DeviceSpec
from testbed.sim.executor import SimExecutor

if TYPE_CHECKING:
    from testbed.sim.recorded_run import RecordedRun


@dataclass
class SimPlan:
    config: SimConfig
    clock: VirtualClock | ReplayClock  # a VirtualClock, or the recorded run's ReplayClock
    dtype: torch.dtype
    kernel: str  # the kernel a profile was measured with (auto resolves to it); else as configured
    recorded: RecordedRun | None = None  # replay_steps
    tensor_parallel_size: int = 1  # each replica's ranks: sized and priced per rank (testbed.parallel.sim_cost)

    def num_blocks(self, arch, block_size: int, gpu_memory_utilization: float, kv_cache_memory_gb: float) -> int:
        """KV blocks of the simulated device: what its memory holds after the weights (roofline), the CPU
        budget (profile), or exactly the recorded run's (replay_steps)."""
        if self.recorded is not None and self.recorded.num_blocks:
            return self.recorded.num_blocks
        arch = rank_arch(arch, self.tensor_parallel_size)  # one rank's weights and KV heads
        per_block = arch.kv_bytes_per_token(self.dtype.itemsize) * block_size
        if self.recorded is None and cost_model_class(self.config.cost_model).kv_capacity == "device":
            from testbed.sim.capacity import weight_bytes
            from testbed.sim.devices import load_device

            if self.config.device is None:  # SimConfig refuses a device-capacity cost model without one
                raise ValueError(f"the {self.config.cost_model} cost model needs a device (device=h100-sxm, ...)")
            device = load_device(self.config.device)
            weights = weight_bytes(arch, self.dtype.itemsize)  # every weight held, the embedding table too
            budget = device.memory_gb * 2**30 * gpu_memory_utilization - weights
            where = f"{device.name} ({device.memory_gb:g} GB, weights {weights / 2**30:.1f} GiB)"
        else:
            budget = kv_cache_memory_gb * 2**30
            where = f"kv_cache_memory_gb={kv_cache_memory_gb}"
        num_blocks = int(budget // per_block)
        if num_blocks < 1:
            raise ValueError(f"no KV block of {per_block} bytes fits on {where}")
        return num_blocks


def sim_config(engine_config) -> SimConfig:
    """The simulation's settings: executor.sim, or the defaults (which refuse a roofline without a device)."""
    return engine_config.executor.sim or SimConfig()


def plan_simulation(engine_config, clock=None) -> SimPlan:
    """The simulation an executor=sim engine runs. Checks the cost model's inputs exist before anything is
    built (unknown device, missing profile or recorded run: a clear error now)."""
    sim = sim_config(engine_config)
    tp = engine_config.parallel.tensor_parallel_size
    if tp > 1 and (sim.cost_model == REPLAY_STEPS or cost_model_class(sim.cost_model).tensor_parallel is None):
        raise ValueError(
            f"executor.cost_model={sim.cost_model} does not price tensor parallelism "
            "(parallel.tensor_parallel_size > 1 runs with roofline or profile)"
        )
    if tp > 1:
        load_link(sim.tp_link)  # an unknown link fails now
    recorded = None
    dtype = engine_config.model.dtype
    kernel = engine_config.executor.kernel
    if sim.cost_model == REPLAY_STEPS:
        from testbed.sim.recorded_run import RecordedRun

        if sim.run is None:  # SimConfig refuses replay_steps without one
            raise ValueError("the replay_steps cost model needs a recorded run folder (executor.run=DIR)")
        recorded = RecordedRun(sim.run)
        dtype = dtype or recorded.dtype
    else:
        dtype, kernel = cost_model_class(sim.cost_model).resolve(sim, dtype, kernel)
    if clock is None:
        clock = recorded.clock() if recorded is not None else VirtualClock()
    return SimPlan(sim, clock, getattr(torch, dtype), kernel, recorded, tp)


def build_sim_executor(
    plan: SimPlan,
    spec,
    token_id: int,
    speculative,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    copy_cost=None,
):
    """(executor, speculator): the cost model named by the plan, checked against the model, kernel, dtype."""
    from testbed.sim.proposer import FixedDraftProposer
    from testbed.spec import Speculator

    sim = plan.config
    cost_model = None  # replay_steps: the clock replays the recorded run's readings
    if sim.cost_model != REPLAY_STEPS:
        context = CostContext(
            arch=rank_arch(spec.arch, plan.tensor_parallel_size),  # one rank's share
            dtype=plan.dtype,
            device=sim.device if isinstance(sim.device, DeviceSpec) else None,
            profile=sim.profile,
            model=spec.name,
            kernel=plan.kernel,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            allow_extrapolation=sim.allow_extrapolation,
        )
        cost_model = build_cost_model(sim.cost_model, context, sim.cost_model_options)
    if plan.tensor_parallel_size > 1:
        cost_model = _tensor_parallel(cost_model, plan, spec)
    if cost_model is not None and sim.cost_scale != 1:
        from testbed.sim.cost_models.scaled import ScaledCost

        cost_model = ScaledCost(cost_model, sim.cost_scale)
    speculator = None
    if speculative.enabled:  # a SpeculativeConfig
        speculator = Speculator(speculative, FixedDraftProposer(token_id), spec.max_model_len)
    recorded = plan.recorded
    executor = SimExecutor(
        cost_model, plan.clock, token_id, speculator, sim.spec_acceptance, sim.seed, recorded, copy_cost
    )
    return executor, speculator


def _tensor_parallel(cost_model, plan: SimPlan, spec):
    """The rank's cost (roofline: already its shape; profile: scaled) plus the collectives over the TP link."""
    from testbed.parallel.sim_cost import ScaledProfile, TensorParallelCost

    n = plan.tensor_parallel_size
    per_rank = cost_model if cost_model.tensor_parallel == "rank" else ScaledProfile(cost_model, n)
    return TensorParallelCost(per_rank, spec.arch, plan.dtype.itemsize, n, load_link(plan.config.tp_link))
