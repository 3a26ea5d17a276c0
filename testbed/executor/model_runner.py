"""The real executor: runs one scheduled step of the model over its paged KV cache, and samples."""

from typing import NamedTuple

import torch

from testbed.core.scheduler import SchedulerOutput
from testbed.executor.base import ExecutorOutput, StepExecutor
from testbed.executor.block_tables import BlockTables
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import ModelInputs, StagedInputs, stage_inputs
from testbed.executor.kv_cache import KVBlockCopier
from testbed.executor.prompt_logprobs import prompt_logprobs
from testbed.executor.sampler import Sampler


class PreparedStep(NamedTuple):
    out: SchedulerOutput
    staged: StagedInputs
    pad_to: int | None  # the captured graph's batch size, or None (eager)


class ModelRunner(StepExecutor):
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
        self.copier = copier  # swap preemption's block copies (None: recompute preemption)
        self.spec = speculator  # testbed.spec.Speculator (verifies drafts; a draft model observes inputs)
        self.cuda_graphs = cuda_graphs  # testbed.executor.cuda_graphs.CudaGraphRunner: decode steps replay graphs
        self.last_inputs: ModelInputs | None = None

    def prepare(self, out: SchedulerOutput) -> PreparedStep:
        self.tables.apply(out.finished_ids, out.block_updates)
        graphs = self.cuda_graphs
        pad_to = graphs.padded_size(out) if graphs is not None else None
        return PreparedStep(out, stage_inputs(out, self.tables, self.input_buffers, pad_to), pad_to)

    @torch.inference_mode()
    def run(self, prepared: PreparedStep, last_tokens: dict[str, int]) -> ExecutorOutput:
        out, pad_to = prepared.out, prepared.pad_to
        if out.kv_copies:
            assert self.copier is not None, "swap copies without a host pool"
            self.copier.run(out.kv_copies)
        self.sampler.forget(out.finished_ids)
        inputs = self.last_inputs = prepared.staged.to_device(last_tokens)
        hidden = self.cuda_graphs.replay(pad_to, len(out.requests)) if pad_to is not None else None
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
