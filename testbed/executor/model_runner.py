"""The real executor: owns the model and its paged KV cache, runs one scheduled step, samples."""

from dataclasses import dataclass

import torch

from testbed.core.scheduler import SchedulerOutput
from testbed.executor.inputs import prepare_inputs
from testbed.executor.prompt_logprobs import prompt_logprobs
from testbed.executor.sampler import Sampler


@dataclass
class ExecutorOutput:
    sampled: list[list[int] | None]  # per scheduled request: new tokens (None mid-prefill)
    logprobs: list[list[dict] | None] | None  # per scheduled request: per new token {token id: Logprob}
    # per scheduled request: {token id: Logprob} of the prompt tokens this step scored (prompt_logprobs)
    prompt_logprobs: list[list[dict] | None] | None = None


def allocate_kv_cache(arch, num_blocks: int, block_size: int, num_layers: int, dtype, device):
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]


def copy_kv_blocks(device_caches, host_caches, src: list[int], dst: list[int], to_host: bool) -> None:
    """Swap preemption's byte mover: KV blocks src -> dst, device -> host pool (to_host) or back, every layer."""
    src_ids, dst_ids = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)
    for device_kv, host_kv in zip(device_caches, host_caches):
        for dev, host in zip(device_kv, host_kv):
            if to_host:
                host[dst_ids] = dev[src_ids.to(dev.device)].to("cpu")
            else:
                dev[dst_ids.to(dev.device)] = host[src_ids].to(dev.device)


class ModelRunner:
    def __init__(self, model, kv_caches, block_size: int, block_ids_of, sampler: Sampler, device, spec=None):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.block_ids_of = block_ids_of
        self.sampler = sampler
        self.device = device
        self.spec = spec  # testbed.spec.Speculator, or None
        self.input_buffers = None  # testbed.executor.host_buffers.InputBuffers (pinned staging), set by the engine
        self.cuda_graphs = None  # testbed.executor.cuda_graphs.CudaGraphRunner: decode steps replay graphs
        self.host_kv_caches = None  # host pool for swap preemption (same layout), set by the engine

    @torch.inference_mode()
    def copy_blocks(self, src: list[int], dst: list[int], to_host: bool) -> None:
        """Swap preemption: copy KV blocks src -> dst, device -> host pool (to_host) or back, every layer."""
        copy_kv_blocks(self.kv_caches, self.host_kv_caches, src, dst, to_host)
        if self.spec is not None:
            self.spec.copy_blocks(src, dst, to_host)  # a draft model's own KV moves with the target's

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        self.sampler.forget(out.finished_ids)
        graphs = self.cuda_graphs
        pad_to = graphs.padded_size(out) if graphs is not None else None
        inputs = prepare_inputs(out, self.block_ids_of, self.block_size, self.device, self.input_buffers, pad_to)
        hidden = graphs.replay(pad_to, len(out.requests)) if pad_to is not None else None
        if hidden is None:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        if self.spec is not None:
            self.spec.observe(inputs)  # a draft model writes its KV into the same slots
        sampled: list[list[int] | None] = [None] * len(out.requests)
        logprobs = None
        prompt_lps = prompt_logprobs(out, hidden, self.model.compute_logits)  # None unless a request asks
        rows = [i for i, k in enumerate(inputs.num_logits) if k]
        if rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            if self.spec is not None and any(k > 1 for k in inputs.num_logits):
                # 1 + k rows for a request with k drafts: speculative verification
                verified = self.spec.verify(out.requests, inputs.num_logits, logits, self.sampler)
                return ExecutorOutput(*verified, prompt_lps)
            # one token per request here (one logits row each, in order); drafts are the speculative executor's job
            tokens, lps = self.sampler.sample(logits, [out.requests[i] for i in rows])
            for j, i in enumerate(rows):
                sampled[i] = [tokens[j]]
            if lps is not None:
                logprobs = [None] * len(out.requests)
                for j, i in enumerate(rows):
                    logprobs[i] = [lps[j]] if lps[j] is not None else None
        return ExecutorOutput(sampled, logprobs, prompt_lps)


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total
