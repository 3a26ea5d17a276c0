"""executor=sim: the real scheduler, KV cache and policies; each step priced by a cost model on a virtual
clock (testbed.sim.build). Nothing runs on a device: the simulated one is the cost model's."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from testbed.executor.kind import ExecutorKind, ExecutorParts, filler_token
from testbed.sim.build import build_sim_executor, plan_simulation, sim_config
from testbed.sim.cost_models import REPLAY_STEPS
from testbed.sim.decode_runs import DecodeRuns
from testbed.sim.host_copies import host_copy_cost

if TYPE_CHECKING:
    from testbed.models.build import ModelSpec


class SimKind(ExecutorKind):
    name = "sim"
    simulated = True
    async_refused = "a simulation"  # its clock is the cost model's: there is no host time to overlap

    @classmethod
    def check_config(cls, config) -> None:
        sim_config(config)  # tensor parallelism: priced by testbed.parallel.sim_cost

    @classmethod
    def executor_fields(cls, group: dict, device: dict) -> dict:
        """Every key but `name` is a SimConfig field (it refuses those it does not know); the device group is
        the simulated device's spec sheet."""
        sim = {k: v for k, v in group.items() if k != "name"}
        return {"sim": ({**sim, "device": device}, "executor")}

    @classmethod
    def check_cluster(cls, config) -> None:
        if sim_config(config).cost_model == REPLAY_STEPS:
            raise ValueError("cost_model=replay_steps replays one recorded engine's clock: it cannot price a cluster")

    @classmethod
    def replica_config(cls, config, index: int):
        """Also the simulation's own draws (speculative acceptance) seeded per replica."""
        sim = sim_config(config)
        executor = dataclasses.replace(config.executor, sim=dataclasses.replace(sim, seed=sim.seed + index))
        return dataclasses.replace(config, seed=config.seed + index, executor=executor)

    def __init__(self, config, clock=None):
        super().__init__(config, clock)
        self.plan = plan_simulation(config, clock)  # the cost model's inputs checked before anything is built
        self.clock, self.dtype, self.kernel = self.plan.clock, self.plan.dtype, self.plan.kernel

    def num_blocks(self, arch, kv_dtype) -> int:
        cache = self.config.cache
        return cache.num_blocks or self.plan.num_blocks(
            arch, cache.block_size, cache.gpu_memory_utilization, cache.memory_gb
        )

    def build(
        self, model_spec: ModelSpec, sampler, num_blocks: int, num_cpu_blocks: int | None, block_bytes: int
    ) -> ExecutorParts:
        config = self.config
        executor, speculator = build_sim_executor(
            self.plan,
            model_spec,
            filler_token(model_spec),
            config.speculative,
            config.scheduler.max_num_seqs,
            config.scheduler.max_num_batched_tokens,
            host_copy_cost(config.cache.host_tier, block_bytes),
        )
        return ExecutorParts(executor, None, speculator)

    def decode_runs(self, scheduler, kv, executor, emit_run, kv_stats, speculating: bool):
        if self.plan.config.skip_steps and not speculating:
            return DecodeRuns(scheduler, kv, executor, emit_run, kv_stats)
        return None

    def summary(self, executor) -> dict:
        """The cost model's identity (device, profile, fit) and the simulated seconds, as sim_* keys."""
        return {f"sim_{k}": v for k, v in executor.identity.items()}

    def sleep(self, seconds: float) -> None:
        self.plan.clock.sleep(seconds)  # idle time is virtual
