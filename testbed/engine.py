"""The engine: add requests, step (schedule -> execute -> update), abort. One process, no Hydra."""

import time
from dataclasses import dataclass

import torch

from testbed.attention import get_backend
from testbed.config import EngineConfig
from testbed.core.allocators import get_allocator
from testbed.core.allocators.base import final_length
from testbed.core.kv_cache_manager import KVCacheStats
from testbed.core.policies import get_policy
from testbed.core.scheduler import Scheduler, SchedulerConfig
from testbed.executor.model_runner import ModelRunner, allocate_kv_cache
from testbed.executor.sampler import Sampler
from testbed.models.build import build_model
from testbed.outputs import RequestOutput
from testbed.request import Request, RequestStatus
from testbed.sampling_params import SamplingParams
from testbed.spec import build_speculator


@dataclass
class StepStats:
    step: int
    start_time: float
    duration_s: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    num_waiting: int
    num_running: int
    kv: KVCacheStats


class Engine:
    def __init__(self, config: EngineConfig, clock=time.monotonic):
        self.config = config
        self.clock = clock
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype_name = config.dtype or ("bfloat16" if self.device.type == "cuda" else "float32")
        self.dtype = getattr(torch, dtype_name)
        self.kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else getattr(torch, config.kv_cache_dtype)
        self.backend = get_backend(config.kernel)
        bs = config.block_size
        if self.backend.requires_power_of_two_block_size and bs & (bs - 1):
            raise ValueError(f"kernel={config.kernel} needs a power-of-two block_size, got {bs}")
        self.model, self.arch, self.tokenizer, self.model_name = build_model(
            config.model, self.backend, self.dtype, self.device, config.seed, config.max_model_len
        )
        self.max_model_len = self.model.max_positions
        num_blocks = config.num_blocks or self._blocks_from_memory()
        self.kv = get_allocator(
            config.cache,
            num_blocks,
            bs,
            enable_prefix_caching=config.enable_prefix_caching,
            eviction=config.eviction,
            max_model_len=self.max_model_len,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_batched_tokens, config.max_num_seqs, config.enable_chunked_prefill, self.max_model_len
            ),
            self.kv,
            get_policy(config.scheduler, **config.scheduler_options),
            clock,
        )
        self.spec = build_speculator(config.speculative_config, self)  # None without speculative decoding
        extra_blocks = self.spec.extra_target_kv_blocks if self.spec else 0
        kv_caches = (
            None
            if config.executor == "null"
            else allocate_kv_cache(
                self.arch, num_blocks + extra_blocks, bs, self.arch.num_hidden_layers, self.kv_dtype, self.device
            )
        )
        sampler = Sampler(config.seed, self.device)
        self.executor = ModelRunner(
            self.model, kv_caches, bs, self.kv.get_block_ids, sampler, self.device, spec=self.spec
        )
        if self.spec:
            self.spec.attach(self, kv_caches, sampler)
        if config.executor == "null":  # host-side cost measurement: no model runs
            from testbed.executor.null_executor import NullExecutor

            self.executor = NullExecutor.for_engine(self)
        else:  # pinned input staging; decode CUDA graphs unless enforce_eager
            from testbed.executor.cuda_graphs import setup_fast_path

            setup_fast_path(self, kv_caches)
        if config.preemption_mode == "swap":
            self._setup_swap(bs)
        self.step_count = 0
        self.last_stats: StepStats | None = None
        self.step_callbacks = []  # called with each StepStats (recorders)

    def _setup_swap(self, block_size: int) -> None:
        """Host (CPU) pool for swap preemption, sized like the device cache from swap_space_gb."""
        from testbed.core.swap import SwapManager

        num_cpu_blocks = self.config.num_cpu_blocks or max(
            1,
            int(
                self.config.swap_space_gb * 2**30 // (self.arch.kv_bytes_per_token(self.kv_dtype.itemsize) * block_size)
            ),
        )
        copy = None
        if hasattr(self.executor, "copy_blocks") and getattr(self.executor, "kv_caches", None) is not None:
            self.executor.host_kv_caches = allocate_kv_cache(
                self.arch, num_cpu_blocks, block_size, self.arch.num_hidden_layers, self.kv_dtype, "cpu"
            )
            copy = self.executor.copy_blocks
        self.scheduler.swap = SwapManager(self.kv, num_cpu_blocks, copy)

    def _blocks_from_memory(self) -> int:
        bytes_per_block = self.arch.kv_bytes_per_token(self.kv_dtype.itemsize) * self.config.block_size
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - total * (1 - self.config.gpu_memory_utilization)
        else:
            budget = self.config.kv_cache_memory_gb * 2**30
        num_blocks = int(budget // bytes_per_block)
        if num_blocks < 1:
            raise ValueError(f"KV-cache budget of {budget / 2**30:.3f} GiB holds no block of {bytes_per_block} bytes")
        return num_blocks

    @property
    def eos_token_ids(self) -> list[int]:
        ids = list(self.arch.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    # ---- requests -----------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str = "?") -> None:
        """Raise before any work if this request can never run."""
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError(f"request {request_id}: the prompt is empty")
        if n >= self.max_model_len:
            raise ValueError(
                f"request {request_id}: prompt of {n} tokens leaves no room to generate within "
                f"max_model_len={self.max_model_len}"
            )
        bad = [t for t in prompt_token_ids if not 0 <= t < self.arch.vocab_size]
        if bad:
            raise ValueError(
                f"request {request_id}: token id {bad[0]} outside the vocabulary [0, {self.arch.vocab_size})"
            )
        if not self.config.enable_chunked_prefill and n > self.config.max_num_batched_tokens:
            raise ValueError(
                f"request {request_id}: prompt of {n} tokens exceeds max_num_batched_tokens="
                f"{self.config.max_num_batched_tokens} and chunked prefill is off"
            )
        final_len = min(n + (params.max_tokens or self.max_model_len), self.max_model_len)
        need = self.kv.blocks_for_request(final_len)
        if need > self.kv.num_blocks:
            raise ValueError(
                f"request {request_id}: {final_len} tokens need {need} KV blocks of "
                f"{self.kv.block_size}, the whole cache has {self.kv.num_blocks}"
            )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> Request:
        params = params or SamplingParams()
        if request_id in self.scheduler.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        self.validate(prompt_token_ids, params, request_id)
        request = Request(
            request_id,
            prompt_token_ids,
            params,
            self.clock() if arrival_time is None else arrival_time,
            priority,
            self.eos_token_ids,
        )
        self.scheduler.add_request(request)
        return request

    def abort(self, request_id: str) -> RequestOutput | None:
        request = self.scheduler.abort(request_id)
        return None if request is None else self._output(request, [])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = self.clock()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            if self.scheduler.num_running == 0 and self.scheduler.num_waiting:
                # validation guarantees any single request fits: an empty step here is a scheduler bug
                raise RuntimeError(
                    f"scheduler stalled with {self.scheduler.num_waiting} waiting requests "
                    f"and {self.kv.pool.num_free_blocks} free blocks"
                )
            return []
        result = self.executor.execute(sched)
        updates = self.scheduler.update(sched, result.sampled, result.logprobs)
        outputs = []
        of_request = RequestOutput.of_request  # one output per request per step: O(1) each (testbed.outputs)
        for request, new_tokens in updates:
            if request.sampling_params.stop and not request.status.finished:
                self._check_stop_strings(request)
            outputs.append(
                self._output(request, new_tokens) if request.status.finished else of_request(request, new_tokens)
            )
        if self.spec:
            self.spec.propose(self.scheduler.running)  # drafts for the next step's verification
        self.step_count += 1
        self.last_stats = StepStats(
            self.step_count,
            start,
            self.clock() - start,
            len(sched.requests),
            sched.num_prefill_tokens,
            sched.num_decode_tokens,
            len(sched.preempted),
            self.scheduler.num_waiting,
            self.scheduler.num_running,
            self._kv_stats(),
        )
        for callback in self.step_callbacks:
            callback(self.last_stats)
        return outputs

    def _kv_stats(self) -> KVCacheStats:
        """The KV memory breakdown after a step: O(1) from the paged allocator's counters, else a pass
        over the running requests (the static allocators' accounting needs their final lengths)."""
        scheduler = self.scheduler
        if hasattr(self.kv, "stats_from_counters"):
            return self.kv.stats_from_counters(scheduler.running_computed_tokens)
        return self.kv.stats(
            {r.request_id: r.num_computed_tokens for r in scheduler.running},
            {r.request_id: final_length(r, self.max_model_len) for r in scheduler.running},
            scheduler.blocked_request,
        )

    @property
    def spec_stats(self) -> dict:
        """Speculative decoding counters (empty without speculation)."""
        return self.spec.stats() if self.spec else {}

    def _check_stop_strings(self, request: Request) -> None:
        if self.tokenizer is None:
            return
        text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        for stop in request.sampling_params.stop:
            if stop in text:
                request.stop_reason = stop
                self.scheduler.finish_with_status(request, RequestStatus.FINISHED_STOPPED)
                return

    def _output(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        """The request's output as it is now; a finished one gets its text (decoded only then)."""
        text = ""
        if request.status.finished and self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
            if isinstance(request.stop_reason, str):
                text = text[: text.index(request.stop_reason)]
        return RequestOutput.of_request(request, new_tokens, text)
