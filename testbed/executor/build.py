"""Build the real executor (executor=real: the model runs here) with everything it needs, in one pass (no part
is completed or replaced afterwards)."""

import torch

from testbed.config import EngineConfig
from testbed.executor.block_tables import BlockTables
from testbed.executor.cuda_graphs import CudaGraphRunner, default_capture_sizes, use_cuda_graphs
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.host_memory import keep_freed_memory
from testbed.executor.kind import ExecutorParts
from testbed.executor.kv_cache import KVBlockCopier, allocate_kv_cache, kv_cache_dtype
from testbed.executor.model_runner import ModelRunner
from testbed.executor.sampler import Sampler
from testbed.models.build import ModelSpec, build_model
from testbed.parallel.config import shard_arch
from testbed.parallel.start import start_tensor_parallel
from testbed.spec import build_speculator, proposer_class
from testbed.spec.draft import DraftModelProposer, num_scratch_blocks

# block-table columns beyond max_model_len's blocks: speculative lookahead
LOOKAHEAD_BLOCKS = 8


def table_width(spec: ModelSpec, block_size: int) -> int:
    """Block-table columns: max_model_len's blocks and the speculative lookahead."""
    return -(-spec.max_model_len // block_size) + LOOKAHEAD_BLOCKS


def build_executor(
    config: EngineConfig,
    spec: ModelSpec,
    backend,
    num_blocks: int,
    num_cpu_blocks: int | None,
    device: torch.device,
    dtype: torch.dtype,
    sampler: Sampler,
) -> ExecutorParts:
    """The model runner (tensor parallel: rank 0's, the workers started) with its model and speculator.
    num_cpu_blocks: the host pool for swap preemption (None: recompute preemption, no pool)."""
    block_size, max_num_seqs = config.cache.block_size, config.scheduler.max_num_seqs
    width = table_width(spec, block_size)
    tables = BlockTables(width, max_num_seqs)
    if device.type == "cpu":
        keep_freed_memory()
    tp = start_tensor_parallel(config, spec, backend.name, num_blocks, num_cpu_blocks, device, dtype)
    if tp is None:
        model = build_model(spec, backend, dtype, device, config.seed)
    else:  # rank 0's shard, loaded alone; the workers load theirs meanwhile
        model = tp.build_model(spec, backend, dtype, device, config.seed)
    spec_config = config.speculative
    scratch = 0
    if spec_config.enabled and proposer_class(spec_config.method).writes_target_kv:
        scratch = num_scratch_blocks(spec_config.num_speculative_tokens, block_size, max_num_seqs)
    kv_dtype = kv_cache_dtype(config.cache, dtype)
    kv_arch = shard_arch(spec.arch, config.parallel.tensor_parallel_size)  # this rank's KV heads
    kv_caches = allocate_kv_cache(
        kv_arch, num_blocks + scratch, block_size, spec.arch.num_hidden_layers, kv_dtype, device
    )
    speculator = build_speculator(
        spec_config,
        target=model,
        target_kv_caches=kv_caches,
        tables=tables,
        sampler=sampler,
        backend=backend,
        dtype=dtype,
        device=device,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_model_len=spec.max_model_len,
        seed=config.seed,
    )
    copier = KVBlockCopier(_copy_pairs(spec, config, kv_caches, speculator, num_cpu_blocks, kv_dtype, dtype))

    executor = config.executor
    eager = executor.enforce_eager or tp is not None  # TP runs eagerly (no collectives in captured graphs)
    graphs = executor.cuda_graph_dry_run or use_cuda_graphs(eager, backend, device)
    sizes = executor.cuda_graph_sizes or default_capture_sizes(max_num_seqs)
    seqs = max(max_num_seqs, max(sizes)) if graphs else max_num_seqs
    buffers = InputBuffers(
        block_size,
        max(config.scheduler.max_num_batched_tokens, seqs),
        seqs,
        width,
        device,
        static=True if graphs else None,
    )
    cuda_graphs = None
    if graphs:
        cuda_graphs = CudaGraphRunner(
            model, kv_caches, buffers, sizes, spec.max_model_len, capture=not executor.cuda_graph_dry_run
        ).capture()
    runner = ModelRunner(model, kv_caches, tables, buffers, sampler, copier, speculator, cuda_graphs)
    if tp is not None:
        return ExecutorParts(tp.executor(runner), model, speculator)
    return ExecutorParts(runner, model, speculator)


def _copy_pairs(spec, config, kv_caches, speculator, num_cpu_blocks, kv_dtype, draft_dtype) -> list:
    """(device caches, host pool or None) for every KV that block copies move: the target's and, with a draft
    model, the draft's (its KV lives in the same block ids). Host pools only with swap preemption."""

    def host_pool(arch, num_layers, dtype):
        if num_cpu_blocks is None:
            return None
        return allocate_kv_cache(arch, num_cpu_blocks, config.cache.block_size, num_layers, dtype, "cpu")

    arch = shard_arch(spec.arch, config.parallel.tensor_parallel_size)
    pairs = [(kv_caches, host_pool(arch, arch.num_hidden_layers, kv_dtype))]
    proposer = speculator.proposer if speculator else None
    if isinstance(proposer, DraftModelProposer):
        pairs.append((proposer.kv_caches, host_pool(proposer.model.arch, proposer.num_layers, draft_dtype)))
    return pairs
