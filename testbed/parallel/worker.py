"""A tensor-parallel worker (ranks 1..N-1): build its shard, then follow rank 0's commands until "stop".

Started by the engine (testbed.parallel.executor, torch.multiprocessing spawn) on one machine, or by torchrun /
Slurm srun on several: then every rank runs the entry script, rank 0 builds the engine and the others call
`run_worker` (run.py and serve.py do it first thing, see `serve_if_worker`).
"""

import logging
import sys
import traceback
from dataclasses import dataclass

import torch

from testbed.attention import get_backend
from testbed.config import EngineConfig
from testbed.executor.block_tables import BlockTables
from testbed.executor.build import LOOKAHEAD_BLOCKS
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import stage_inputs
from testbed.executor.kv_cache import KVBlockCopier, allocate_kv_cache
from testbed.models.build import load_model_spec_from
from testbed.parallel.comm import TPGroup, env_rank, init_default, make_group
from testbed.parallel.config import shard_arch
from testbed.parallel.messages import WorkerStep
from testbed.parallel.sharding import VocabParallelHead, build_rank_model

logger = logging.getLogger(__name__)

# how long ranks wait for each other to join and for rank 0's plan (rank 0 resolves its model first)
JOIN_TIMEOUT_S = 600.0


@dataclass
class WorkerPlan:
    """What rank 0 decided and every worker builds from (sent once, after the group forms)."""

    config: EngineConfig
    num_blocks: int
    num_cpu_blocks: int | None
    dtype: str
    kv_dtype: str
    device_type: str
    kernel: str
    num_threads: int  # torch intra-op threads per rank: rank 0's


class WorkerShard:
    """One worker's shard: its model slice, its KV heads, its copy of the block tables and input buffers."""

    def __init__(self, plan: WorkerPlan, group: TPGroup):
        config = plan.config
        spec = load_model_spec_from(config.model)
        dtype, kv_dtype = getattr(torch, plan.dtype), getattr(torch, plan.kv_dtype)
        self.device = group.device
        self.model = build_rank_model(spec, get_backend(plan.kernel), dtype, self.device, config.seed, group)
        arch = shard_arch(spec.arch, group.world_size)
        layers = arch.num_hidden_layers
        block_size = config.cache.block_size
        self.kv_caches = allocate_kv_cache(arch, plan.num_blocks, block_size, layers, kv_dtype, self.device)
        host = None
        if plan.num_cpu_blocks is not None:
            host = allocate_kv_cache(arch, plan.num_cpu_blocks, block_size, layers, kv_dtype, "cpu")
        self.copier = KVBlockCopier([(self.kv_caches, host)])
        width = -(-spec.max_model_len // block_size) + LOOKAHEAD_BLOCKS
        seqs = config.scheduler.max_num_seqs
        self.tables = BlockTables(width, seqs)
        self.buffers = InputBuffers(
            block_size, max(config.scheduler.max_num_batched_tokens, seqs), seqs, width, self.device
        )
        self.group = group

    @torch.inference_mode()
    def step(self, out: WorkerStep, last_tokens: dict[str, int]) -> None:
        """Rank 0's forward, on this shard (ModelRunner.prepare + the device half of ModelRunner.run)."""
        self.tables.apply(out.finished_ids, out.block_updates)
        staged = stage_inputs(out, self.tables, self.buffers)
        if out.kv_copies:
            self.copier.run(out.kv_copies)
        inputs = staged.to_device(last_tokens)
        self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

    @torch.inference_mode()
    def logits(self, shape: tuple, dtype: str) -> None:
        hidden = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
        head = self.model.lm_head
        if not isinstance(head, VocabParallelHead):  # build_rank_model puts one there
            raise TypeError(f"a tensor-parallel rank's model needs a VocabParallelHead, got {type(head).__name__}")
        head.local(self.group.broadcast(hidden))

    def serve(self) -> None:
        while True:
            command = self.group.receive()
            if command[0] == "step":
                self.step(command[1], command[2])
            elif command[0] == "logits":
                self.logits(command[1], command[2])
            elif command[0] == "stop":
                return
            else:
                raise RuntimeError(f"unknown tensor-parallel command {command[0]!r}")


def run_worker(rank: int, world_size: int, init_method: str, join_timeout_s: float) -> None:
    """A worker's whole life: join, receive the plan, build (reporting failure to rank 0), serve."""
    init_default(rank, world_size, init_method, join_timeout_s)
    box: list = [None]
    torch.distributed.broadcast_object_list(box, src=0)
    plan: WorkerPlan = box[0]
    torch.set_num_threads(plan.num_threads)
    group = make_group(rank, world_size, plan.device_type, plan.config.parallel.timeout_s)
    shard, report = None, None
    try:
        shard = WorkerShard(plan, group)
    except Exception:
        report = f"rank {rank} failed to build its shard:\n{traceback.format_exc()}"
    group.gather_objects(report)
    if shard is None:
        return
    try:
        shard.serve()
    finally:
        group.close()


def serve_if_worker() -> bool:
    """Under torchrun / srun (RANK or SLURM_PROCID, WORLD_SIZE or SLURM_NTASKS, MASTER_ADDR/MASTER_PORT set):
    on ranks above 0 serve as a worker and return True (the caller then exits); False on rank 0 or alone."""
    launched = env_rank()
    if launched is None or launched[0] == 0:
        return False
    try:
        run_worker(launched[0], launched[1], "env://", JOIN_TIMEOUT_S)
    except Exception:
        logger.exception("tensor-parallel worker rank %d failed", launched[0])
        sys.exit(1)
    return True
