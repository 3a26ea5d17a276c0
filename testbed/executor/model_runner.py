"""The real executor: owns the model and its paged KV cache, runs one scheduled step, samples."""
from dataclasses import dataclass

import torch

from testbed.core.scheduler import SchedulerOutput
from testbed.executor.inputs import prepare_inputs
from testbed.executor.sampler import Sampler


@dataclass
class ExecutorOutput:
    sampled: list[list[int] | None]           # per scheduled request: new tokens (None mid-prefill)
    logprobs: list[list[float] | None] | None


def allocate_kv_cache(arch, num_blocks: int, block_size: int, num_layers: int, dtype, device):
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


class ModelRunner:
    def __init__(self, model, kv_caches, block_size: int, block_ids_of, sampler: Sampler, device):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.block_ids_of = block_ids_of
        self.sampler = sampler
        self.device = device

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        self.sampler.forget(out.finished_ids)
        inputs = prepare_inputs(out, self.block_ids_of, self.block_size, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        sampled: list[list[int] | None] = [None] * len(out.requests)
        logprobs = None
        rows = [i for i, k in enumerate(inputs.num_logits) if k]
        if rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            # one token per request here; verification of drafts is the speculative executor's job
            last = torch.tensor(list(_cumsum(inputs.num_logits[i] for i in rows)), device=logits.device) - 1
            reqs = [out.requests[i] for i in rows]
            tokens, lps = self.sampler.sample(logits[last], [r.request_id for r in reqs],
                                              [r.sampling_params for r in reqs])
            for j, i in enumerate(rows):
                sampled[i] = [tokens[j]]
            if lps is not None:
                logprobs = [None] * len(out.requests)
                for j, i in enumerate(rows):
                    logprobs[i] = [lps[j]]
        return ExecutorOutput(sampled, logprobs)


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total
