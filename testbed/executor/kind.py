"""An executor kind: how an engine's steps are executed, and everything that follows from that choice.

A kind owns the engine's clock, device, dtype and kernels, its KV capacity, the executor it builds and the
keys it adds to a run's summary, so the engine asks its kind instead of branching on a name. The kinds are
a registry (testbed.executor_kinds): real (the model runs here), host (no model: the engine's host-side
work only) and sim (a cost model on a virtual clock, testbed.sim.kind); `executor.name=mylab.kinds:MyKind`
(EngineConfig(executor="mylab.kinds:MyKind")) plugs in a researcher's own ExecutorKind subclass.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, NamedTuple

import torch

from testbed.executor.base import Executor

if TYPE_CHECKING:
    from testbed.models.build import ModelSpec
    from testbed.spec.speculator import Speculator


class ExecutorParts(NamedTuple):
    executor: Executor
    model: torch.nn.Module | None  # the target model (None: no model runs)
    speculator: Speculator | None  # drafts after each step (the engine's side of it)


class ExecutorKind:
    """One engine's executor kind, made before anything else of the engine (its clock comes first)."""

    name = ""
    records_clock = False  # a run's clock readings can be replayed (executor=sim cost_model=replay_steps)
    simulated = False  # time is a virtual clock's: runs are deterministic, and replicas form a simulated cluster
    async_refused: str | None = None  # why async scheduling cannot overlap this kind's steps (None: it can)

    @classmethod
    def check_config(cls, config) -> None:
        """Refuse what the EngineConfig alone shows this kind cannot run (called when the config is made)."""

    @classmethod
    def executor_fields(cls, group: dict, device: dict) -> dict:
        """ExecutorConfig field -> (value, the config key it came from), from the composed config's executor
        group (`name` aside) and device group; a key this kind does not read is refused, naming it."""
        unknown = sorted(set(group) - {"name"})
        if unknown:
            raise ValueError(f"executor.{unknown[0]}: not a setting of executor {cls.name!r}")
        return {}

    @classmethod
    def check_cluster(cls, config) -> None:
        """Refuse what a simulated cluster of this kind's engines cannot run (testbed.cluster.build)."""
        if not cls.simulated:
            raise ValueError(f"a simulated cluster needs executor=sim, got executor={config.executor.name!r}")

    @classmethod
    def replica_config(cls, config, index: int):
        """Replica `index`'s EngineConfig in a cluster: its own seeds, so replicas draw independently;
        replica 0's is `config`."""
        return dataclasses.replace(config, seed=config.seed + index)

    def __init__(self, config, clock=None):
        """clock: the engine's time source (default time.monotonic)."""
        self.config = config
        self.clock = clock or time.monotonic
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.kernel = config.executor.kernel  # named in every summary
        self.backend = None  # testbed.attention backend of the kernels that run (None: none run)

    def num_blocks(self, arch, kv_dtype: torch.dtype) -> int:
        """The KV blocks the engine's allocator manages (config.cache.num_blocks when set)."""
        raise NotImplementedError

    def build(
        self, model_spec: ModelSpec, sampler, num_blocks: int, num_cpu_blocks: int | None, block_bytes: int
    ) -> ExecutorParts:
        """The executor, the model it runs and the speculator. num_cpu_blocks: the host pool (swap preemption,
        host KV tier; None without one); block_bytes: one KV block's size."""
        raise NotImplementedError

    def async_by_default(self, speculating: bool) -> bool:
        """Whether steps overlap (async scheduling) when the config leaves it unset."""
        return False

    def decode_runs(self, scheduler, kv, executor, emit_run, kv_stats, speculating: bool):
        """What advances runs of pure decode steps in one go (testbed.sim.decode_runs); None: step one by one."""
        return None

    def summary(self, executor) -> dict:
        """The keys this kind adds to a run's summary.json (beside `executor` and `kernel`)."""
        return {}

    def sleep(self, seconds: float) -> None:
        """Wait for arrivals: the engine's clock has to reach them."""
        time.sleep(seconds)


def filler_token(model_spec: ModelSpec) -> int:
    """The token an executor that runs no model samples: never an EOS id, so requests end at their length."""
    eos = set(model_spec.eos_token_ids)
    return next(t for t in range(len(eos) + 1) if t not in eos)


class LocalKind(ExecutorKind):
    """Steps run on this machine's device (config.executor.device; CUDA when there is one), timed by its clock."""

    def __init__(self, config, clock=None):
        from testbed.attention import get_backend, resolve_kernel
        from testbed.parallel.config import tp_kernel

        super().__init__(config, clock)
        self.device = torch.device(config.executor.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = getattr(torch, config.model.dtype or ("bfloat16" if self.device.type == "cuda" else "float32"))
        kernel = tp_kernel(config.executor.kernel, config.parallel.tensor_parallel_size, self.device.type)
        self.kernel = resolve_kernel(kernel, self.device)
        self.backend = get_backend(self.kernel)

    def num_blocks(self, arch, kv_dtype: torch.dtype) -> int:
        from testbed.executor.kv_cache import num_blocks_from_memory
        from testbed.parallel.config import shard_arch

        cache = self.config.cache
        return cache.num_blocks or num_blocks_from_memory(
            shard_arch(arch, self.config.parallel.tensor_parallel_size),  # each rank holds its KV heads
            kv_dtype,
            cache.block_size,
            self.device,
            cache.memory_gb,
            cache.gpu_memory_utilization,
        )


class RealKind(LocalKind):
    """The model runs on the device (testbed.executor.model_runner; tensor parallel: testbed.parallel)."""

    name = "real"
    records_clock = True

    @classmethod
    def check_config(cls, config) -> None:
        from testbed.parallel.config import check_model_parallel
        from testbed.validation import check_host_memory

        check_model_parallel(config)
        check_host_memory(config)

    def num_blocks(self, arch, kv_dtype: torch.dtype) -> int:
        from testbed.executor.kv_cache import kv_bytes_per_block
        from testbed.validation import check_kv_cache_fits

        num_blocks = super().num_blocks(arch, kv_dtype)
        # before the block pool is built: an absurd budget must fail now, not hang building it
        bytes_per_block = kv_bytes_per_block(arch, kv_dtype, self.config.cache.block_size)
        check_kv_cache_fits(self.config, num_blocks, bytes_per_block, self.device)
        return num_blocks

    def build(
        self, model_spec: ModelSpec, sampler, num_blocks: int, num_cpu_blocks: int | None, block_bytes: int
    ) -> ExecutorParts:
        from testbed.executor.build import build_executor

        config, device, dtype = self.config, self.device, self.dtype
        return build_executor(config, model_spec, self.backend, num_blocks, num_cpu_blocks, device, dtype, sampler)

    def async_by_default(self, speculating: bool) -> bool:
        return self.device.type == "cuda" and not speculating


class HostKind(LocalKind):
    """No model runs: a step is the engine's host-side work (scheduling, KV bookkeeping, input preparation,
    outputs) and a fixed token per request (testbed.executor.host_executor)."""

    name = "host"

    @classmethod
    def check_config(cls, config) -> None:
        if config.parallel.tensor_parallel_size > 1:
            raise ValueError("parallel.tensor_parallel_size > 1 runs with executor=real or executor=sim, not host")

    @classmethod
    def executor_fields(cls, group: dict, device: dict) -> dict:
        fields = super().executor_fields({k: v for k, v in group.items() if k != "step_time_s"}, device)
        if "step_time_s" in group:
            fields["step_time_s"] = (group["step_time_s"], "executor.step_time_s")
        return fields

    def build(
        self, model_spec: ModelSpec, sampler, num_blocks: int, num_cpu_blocks: int | None, block_bytes: int
    ) -> ExecutorParts:
        from testbed.executor.block_tables import BlockTables
        from testbed.executor.build import table_width
        from testbed.executor.host_buffers import InputBuffers
        from testbed.executor.host_executor import HostExecutor

        config, seqs = self.config, self.config.scheduler.max_num_seqs
        block_size = config.cache.block_size
        width = table_width(model_spec, block_size)
        tables = BlockTables(width, seqs)
        tokens = max(config.scheduler.max_num_batched_tokens, seqs)
        buffers = InputBuffers(block_size, tokens, seqs, width, "cpu", False)
        executor = HostExecutor(tables, buffers, filler_token(model_spec), config.executor.step_time_s)
        return ExecutorParts(executor, None, None)
