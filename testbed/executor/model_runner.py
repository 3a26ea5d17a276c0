"""The real executor: runs one scheduled step of the model over its paged KV cache, and samples."""

from typing import NamedTuple

import torch

from testbed.core.sched_output import SchedulerOutput
from testbed.executor.base import ExecutorOutput, StepExecutor
from testbed.executor.block_tables import BlockTables
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import ModelInputs, StagedInputs, stage_inputs
from testbed.executor.kv_cache import KVBlockCopier
from testbed.executor.prompt_logprobs import prompt_logprobs, wanting_prompt_logprobs
from testbed.executor.sampler import Sampler
from testbed.isolation import find_culprits


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
        self.copier = copier  # runs the block copies (swap, copy on write) the SchedulerOutput carries
        self.speculator = speculator  # testbed.spec.Speculator (verifies drafts; a draft model observes inputs)
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
            assert self.copier is not None, "block copies without a copier"
            self.copier.run(out.kv_copies)
        self.sampler.forget(out.finished_ids)
        inputs = self.last_inputs = prepared.staged.to_device(last_tokens)
        hidden = self.cuda_graphs.replay(pad_to, len(out.requests)) if pad_to is not None else None
        if hidden is None:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        if self.speculator is not None:
            self.speculator.observe(inputs)  # a draft model writes its KV into the same slots
        errors: dict[str, str] = {}  # request id -> message (testbed.isolation)
        prompt_lps = self._prompt_logprobs(out, hidden, errors)  # None unless a request asks
        num_logits = inputs.num_logits
        every = all(num_logits)  # decode: every request samples, its logits row in batch order
        rows = list(range(len(num_logits))) if every else [i for i, k in enumerate(num_logits) if k]
        if not rows:
            return ExecutorOutput([None] * len(out.requests), None, prompt_lps, errors or None)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        if self.speculator is not None and any(k > 1 for k in inputs.num_logits):
            # 1 + k rows for a request with k drafts: speculative verification
            sampled_drafts, draft_logprobs = self._verify(out.requests, inputs.num_logits, logits, errors)
            return ExecutorOutput(sampled_drafts, draft_logprobs, prompt_lps, errors or None)
        # one token per request here (one logits row each, in order)
        tokens, lps = self._sample(logits, out.requests if every else [out.requests[i] for i in rows], errors)
        sampled: list[list[int] | None]
        if every:
            sampled = [[token] for token in tokens]
        else:
            sampled = [None] * len(out.requests)
            for j, i in enumerate(rows):
                sampled[i] = [tokens[j]]
        if lps is None:
            return ExecutorOutput(sampled, None, prompt_lps, errors or None)
        logprobs: list[list[dict] | None] = [None] * len(out.requests)
        for j, i in enumerate(rows):
            logprobs[i] = [lps[j]] if lps[j] is not None else None
        return ExecutorOutput(sampled, logprobs, prompt_lps, errors or None)

    # ---- per-request fault isolation (testbed.isolation): the batch call, or each request alone ----------
    def _sample(self, logits: torch.Tensor, requests: list, errors: dict[str, str]):
        """The sampler over the batch; if it raises, row by row (a failed row's token is None). Exact for
        the others when the failure comes before the random draws (grammars, logits processors): a seeded
        row's generator has not moved yet."""
        try:
            return self.sampler.sample(logits, requests)
        except Exception as e:
            alone, failed = find_culprits(
                lambda j: self.sampler.sample(logits[j : j + 1], [requests[j]]), range(len(requests)), e, "sampling"
            )
        errors.update((requests[j].request_id, message) for j, message in failed.items())
        return _aligned(alone, len(requests))

    def _prompt_logprobs(self, out: SchedulerOutput, hidden: torch.Tensor, errors: dict[str, str]):
        compute = self.model.compute_logits

        def one(i: int):
            entries = prompt_logprobs(out, hidden, compute, [i])
            return entries[i] if entries is not None else None

        try:
            return prompt_logprobs(out, hidden, compute)
        except Exception as e:
            alone, failed = find_culprits(one, wanting_prompt_logprobs(out), e, "prompt logprobs")
        errors.update((out.requests[i].request_id, message) for i, message in failed.items())
        return [alone.get(i) for i in range(len(out.requests))]

    def _verify(self, requests: list, num_logits: list[int], logits: torch.Tensor, errors: dict[str, str]):
        """Speculative verification over the batch; if it raises, request by request over its own rows."""
        try:
            return self.speculator.verify(requests, num_logits, logits, self.sampler)
        except Exception as e:
            offsets = [0]
            for n in num_logits:
                offsets.append(offsets[-1] + n)
            alone, failed = find_culprits(
                lambda i: self.speculator.verify(
                    [requests[i]], [num_logits[i]], logits[offsets[i] : offsets[i + 1]], self.sampler
                ),
                [i for i, n in enumerate(num_logits) if n],
                e,
                "speculative verification",
            )
        errors.update((requests[i].request_id, message) for i, message in failed.items())
        return _aligned(alone, len(requests))


def _aligned(alone: dict[int, tuple], n: int) -> tuple[list, list | None]:
    """Results of single-request calls ({index: ([token or tokens], [logprobs] or None)}) as the batch call
    would have returned them: (per index, per index or None); None at the indices that failed."""
    first = [alone[i][0][0] if i in alone else None for i in range(n)]
    if all(alone[i][1] is None for i in alone):
        return first, None
    return first, [alone[i][1][0] if i in alone and alone[i][1] is not None else None for i in range(n)]
