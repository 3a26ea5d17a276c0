"""The real executor: runs one scheduled step of the model over its paged KV cache, and samples."""

import torch

from testbed.core.scheduler import SchedulerOutput
from testbed.executor.base import ExecutorOutput
from testbed.executor.block_tables import BlockTables
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import ModelInputs, prepare_inputs
from testbed.executor.kv_cache import KVBlockCopier
from testbed.executor.prompt_logprobs import prompt_logprobs
from testbed.executor.sampler import Sampler


class ModelRunner:
    def __init__(
        self,
        model,
        kv_caches: list,
        tables: BlockTables,
        buffers: InputBuffers,
        sampler: Sampler,
        copier: KVBlockCopier | None = None,
        speculator=None,
        cuda_graphs=None,
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.tables = tables
        self.input_buffers = buffers
        self.sampler = sampler
        self.copier = copier  # runs the block copies (swap, copy on write) the SchedulerOutput carries
        self.spec = speculator  # testbed.spec.Speculator (verifies drafts; a draft model observes inputs)
        self.cuda_graphs = cuda_graphs  # testbed.executor.cuda_graphs.CudaGraphRunner: decode steps replay graphs
        self.last_inputs: ModelInputs | None = None

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        self.tables.apply(out.finished_ids, out.block_updates)
        if out.kv_copies:
            assert self.copier is not None, "block copies without a copier"
            self.copier.run(out.kv_copies)
        self.sampler.forget(out.finished_ids)
        graphs = self.cuda_graphs
        pad_to = graphs.padded_size(out) if graphs is not None else None
        inputs = self.last_inputs = prepare_inputs(out, self.tables, self.input_buffers, pad_to)
        hidden = graphs.replay(pad_to, len(out.requests)) if pad_to is not None else None
        if hidden is None:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        if self.spec is not None:
            self.spec.observe(inputs)  # a draft model writes its KV into the same slots
        prompt_lps = prompt_logprobs(out, hidden, self.model.compute_logits)  # None unless a request asks
        rows = [i for i, k in enumerate(inputs.num_logits) if k]
        if not rows:
            return ExecutorOutput([None] * len(out.requests), None, prompt_lps)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        if self.spec is not None and any(k > 1 for k in inputs.num_logits):
            # 1 + k rows for a request with k drafts: speculative verification
            verified = self.spec.verify(out.requests, inputs.num_logits, logits, self.sampler)
            return ExecutorOutput(*verified, prompt_lps)
        # one token per request here (one logits row each, in order)
        tokens, lps = self.sampler.sample(logits, [out.requests[i] for i in rows])
        sampled: list[list[int] | None] = [None] * len(out.requests)
        for j, i in enumerate(rows):
            sampled[i] = [tokens[j]]
        if lps is None:
            return ExecutorOutput(sampled, None, prompt_lps)
        logprobs: list[list[dict] | None] = [None] * len(out.requests)
        for j, i in enumerate(rows):
            logprobs[i] = [lps[j]] if lps[j] is not None else None
        return ExecutorOutput(sampled, logprobs, prompt_lps)
