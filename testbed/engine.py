"""The engine: add requests, step (schedule -> execute -> update -> outputs -> drafts), abort.
One process, no Hydra. Every part is built here once, in order, with what it needs."""

import logging
from concurrent.futures import Future
from operator import attrgetter

from testbed.config import EngineConfig
from testbed.core.allocators import get_allocator
from testbed.core.allocators.base import KVCacheStats
from testbed.core.allocators.counter_spans import CounterSpans
from testbed.core.host_tier import attach_host_tier
from testbed.core.policies import get_policy
from testbed.core.sched_output import SchedulerOutput
from testbed.core.scheduler import Scheduler, SchedulerLimits
from testbed.core.step_updates import StepUpdates
from testbed.core.swap import SwapManager
from testbed.executor.async_scheduling import AsyncStepRunner
from testbed.executor.base import ExecutorOutput
from testbed.executor.kv_cache import kv_bytes_per_block, kv_cache_dtype, num_host_blocks
from testbed.executor.sampler import Sampler
from testbed.executor_kinds import executor_kind
from testbed.input_processor import InputProcessor
from testbed.isolation import RunInvalid, error_message
from testbed.models.build import load_model_spec_from
from testbed.output_processor import OutputProcessor
from testbed.outputs import RequestOutput
from testbed.parallel.config import check_tensor_parallel
from testbed.request import Request, RequestStatus
from testbed.sampling_params import SamplingParams
from testbed.sequence_group import SequenceGroup
from testbed.spec.speculator import Proposal
from testbed.step_stats import StepRun, StepStats, kv_compact

logger = logging.getLogger(__name__)

_request_id = attrgetter("request_id")


class Engine:
    def __init__(self, config: EngineConfig, clock=None):
        """clock: the engine's time source (default time.monotonic; a simulation brings its own)."""
        self.config = config
        cache, sched = config.cache, config.scheduler
        kind = self.executor_kind = executor_kind(config.executor.name)(config, clock)  # the engine's clock, device
        self.clock, self.device, self.dtype = kind.clock, kind.device, kind.dtype
        self.kv_dtype = kv_cache_dtype(cache, self.dtype)
        self.kernel, self.backend = kind.kernel, kind.backend  # the kernels that run (named in every summary)
        if self.kv_dtype != self.dtype and self.kernel == "triton":  # kernel=auto resolved to triton
            raise ValueError("kv_cache_dtype other than auto runs with kernel=torch or kernel=cpu, not triton")
        bs = cache.block_size
        if self.backend is not None and self.backend.requires_power_of_two_block_size and bs & (bs - 1):
            raise ValueError(f"kernel={self.kernel} needs a power-of-two block_size, got {bs}")
        model_spec = load_model_spec_from(config.model)
        # before any block is made
        check_tensor_parallel(config.parallel.tensor_parallel_size, model_spec.arch, model_spec.name)
        self.arch, self.tokenizer, self.model_name, self.max_model_len = (
            model_spec.arch,
            model_spec.tokenizer,
            model_spec.name,
            model_spec.max_model_len,
        )
        self.eos_token_ids = model_spec.eos_token_ids
        num_blocks = kind.num_blocks(self.arch, self.kv_dtype)
        self.kv = get_allocator(
            cache.name,
            num_blocks,
            bs,
            enable_prefix_caching=cache.prefix_caching,
            eviction=cache.eviction,
            max_model_len=self.max_model_len,
        )
        swap = num_cpu_blocks = None
        if cache.preemption_mode == "swap":
            num_cpu_blocks = cache.num_cpu_blocks or num_host_blocks(self.arch, self.kv_dtype, bs, cache.swap_space_gb)
            swap = SwapManager(self.kv, num_cpu_blocks)
        block_bytes = kv_bytes_per_block(self.arch, self.kv_dtype, bs)
        num_cpu_blocks = attach_host_tier(cache, self.kv, num_cpu_blocks, block_bytes)
        limits = SchedulerLimits(
            sched.max_num_batched_tokens, sched.max_num_seqs, sched.enable_chunked_prefill, self.max_model_len
        )
        policy = get_policy(sched.name, kv=self.kv, **sched.options)
        self.scheduler = Scheduler(limits, self.kv, policy, self.clock, swap)
        # validate() asks the sampler about vocabulary-dependent parameters, so the engine owns it
        self.sampler = Sampler(
            config.seed,
            self.device,
            self.tokenizer,
            self.arch.vocab_size,
            self.eos_token_ids,
            config.structured_outputs,
            self.max_model_len,
        )
        self.executor, self.model, self.speculator = kind.build(
            model_spec, self.sampler, num_blocks, num_cpu_blocks, block_bytes
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self.async_steps = AsyncStepRunner(self.executor) if self._async_scheduling(config) else None
        # async scheduling: (start, SchedulerOutput, Future) of the step on the worker
        self.running_step: tuple[float, SchedulerOutput, Future[ExecutorOutput]] | None = None
        # requests whose next step must see their last token on the host (penalties, grammars, prompt
        # logprobs): while one runs, a step is finished before the next is scheduled
        self._needs_last_tokens: set[str] = set()
        self.step_count = 0
        self._last_stats: StepStats | None = None
        self._last_run: StepRun | None = None  # a decode run whose last StepStats is made when read
        self.step_callbacks: list = []  # called with each StepStats (recorders)
        # step callback -> what takes a simulation's decode run in one go (a StepRun) instead of its
        # steps one by one (experiments.results.recorder)
        self.run_callbacks: dict = {}
        self.input_processor = InputProcessor(config, self.max_model_len, self.arch.vocab_size, self.kv, self.sampler)
        # a simulation's step skipping (step(horizon=...)); None: one step at a time
        speculating = self.speculator is not None
        self.decode_runs = kind.decode_runs(
            self.scheduler, self.kv, self.executor, self._emit_run, self._kv_compact, speculating
        )

    # ---- requests -----------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str = "?") -> None:
        """Raise before any work if this request can never run (testbed.input_processor)."""
        self.input_processor.check(prompt_token_ids, params, request_id)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        validated: bool = False,
    ) -> Request:
        """Queue a request; with n / best_of > 1 a group of sequences (testbed.sequence_group), whose first
        sequence is returned (its siblings start when it has computed the prompt).

        validated: the caller passed these very prompt and params objects, unchanged, through `validate`
        on this engine (a replay checks its whole trace before it starts, experiments.replay.engine_replicas), so
        they are not checked twice; anything else passes False."""
        params = params or SamplingParams()
        if request_id in self.scheduler.requests or request_id in self.output_processor.groups:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if not validated:
            self.validate(prompt_token_ids, params, request_id)
        arrival_time = self.clock() if arrival_time is None else arrival_time
        if params.num_sequences == 1:
            request = Request(request_id, prompt_token_ids, params, arrival_time, priority, self.eos_token_ids)
        else:
            group = SequenceGroup(request_id, prompt_token_ids, params, arrival_time, priority, self.eos_token_ids)
            taken = [s.request_id for s in group.sequences if s.request_id in self.scheduler.requests]
            if taken:
                raise ValueError(f"request {request_id!r}: sequence id {taken[0]!r} is already in the engine")
            request = group.leader
        self.scheduler.add_request(request)
        for sequence in request.group.sequences if request.group else [request]:
            self.output_processor.add_request(sequence)
        if self.async_steps is not None and (params.uses_processors or params.prompt_logprobs is not None):
            sequences = request.group.sequences if request.group else [request]
            self._needs_last_tokens.update(s.request_id for s in sequences)
        return request

    def _async_scheduling(self, config: EngineConfig) -> bool:
        """As the executor kind has it by default (the real engine: on CUDA); never where it refuses (a
        simulation: its clock is the cost model's) or with speculative decoding (the next step's drafts
        need this step's tokens)."""
        wanted, speculating = config.scheduler.async_scheduling, self.speculator is not None
        if wanted is None:
            return self.executor_kind.async_by_default(speculating)
        what = self.executor_kind.async_refused or ("speculative decoding" if speculating else None)
        if wanted and what:
            raise ValueError(f"async_scheduling cannot overlap {what}: set async_scheduling=false")
        return wanted

    def abort(self, request_id: str) -> RequestOutput | None:
        """End a request (every sequence of a group); its final output, or None if it is not in the engine."""
        group = self.output_processor.groups.get(request_id)
        sequence = self.scheduler.requests.get(request_id)
        if group is None and sequence is not None:
            group = sequence.group  # one sequence's id: its whole group ends
        if group is not None:
            for seq in group.sequences:
                self._needs_last_tokens.discard(seq.request_id)
                if not seq.is_finished and self.scheduler.abort(seq.request_id) is None:
                    seq.status = RequestStatus.FINISHED_ABORTED  # a sibling not started: never in the scheduler
            return self.output_processor.group_ended(group)
        self._needs_last_tokens.discard(request_id)
        request = self.scheduler.abort(request_id)
        return None if request is None else self.output_processor.final_output(request, [])

    def has_unfinished(self) -> bool:
        return self.running_step is not None or self.scheduler.has_unfinished()

    # ---- the loop -----------------------------------------------------------------------------
    def step(self, horizon: float | None = None, sends_on_finish: bool = True) -> list[RequestOutput]:
        """One step: schedule -> execute -> update -> stop strings -> drafts -> outputs. Each part returns
        what it decided and the engine applies it (_finish_step). With async scheduling the next
        step is scheduled and started before this one's tokens are read, and the outputs returned are
        those of the step that finished (one behind).

        horizon: the caller adds no request before the clock reaches it. A simulation may then advance
        the pure decode steps that follow this one and start before it in one go (testbed.sim.decode_runs:
        the same steps, step records and request times as stepping; of their outputs only those of the
        requests that finished are returned, after this step's). None: one step. sends_on_finish: the
        caller may add a request when one finishes (closed loop, sessions, a cluster), so a step in which
        one finished ends there, and a run ends with the first such step (the caller gets its outputs at
        that step's end, as from the step alone); False (it sends by the clock alone, as an open-loop
        replay): the horizon holds past it, and a run goes on past the steps in which requests finish."""
        if self.async_steps is not None:
            return self._step_async(self.async_steps)
        start = self.clock()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            self._check_not_stalled()
            return []
        outputs = self._finish_step(start, sched, self._guarded(sched, self.executor.execute, sched))
        if (
            horizon is not None
            and self.decode_runs is not None
            and not (sends_on_finish and any(o.finished for o in outputs))
        ):
            outputs += self.run_decode(horizon, sends_on_finish)[1]
        return outputs

    def run_decode(self, horizon: float, sends_on_finish: bool = True) -> tuple[int, list[RequestOutput]]:
        """A simulation's run of the decode steps that start before `horizon`, from the engine's state now,
        without a full step first (testbed.sim.decode_runs; sends_on_finish as step's): how many steps
        it advanced, and the final outputs of the requests that finished in them."""
        if self.decode_runs is None:
            raise RuntimeError("this engine advances no decode runs (a simulation with executor.skip_steps)")
        ended: list[Request] = []
        ran = self.decode_runs.run(horizon, ended, past_finishes=not sends_on_finish)
        if not ended:
            return ran, []
        # their final outputs, as the steps that ended them would have made them
        return ran, self.output_processor.process(StepUpdates(ended, [r.output_token_ids[-1:] for r in ended]))

    def _finish_step(self, start: float, sched: SchedulerOutput, result: ExecutorOutput) -> list[RequestOutput]:
        if result.prompt_logprobs is not None:  # before update: a request finishing now has them all
            for request, entries in zip(sched.requests, result.prompt_logprobs):
                if entries:
                    if request.prompt_logprobs is None:
                        raise RuntimeError(f"request {request.request_id!r}: prompt logprobs it did not ask for")
                    request.prompt_logprobs.extend(entries)
        scheduler = self.scheduler
        updates = scheduler.update(sched, result.sampled, result.logprobs, result.errors)
        for request, status, error in self.output_processor.find_stops(updates):  # stop strings, failed decodes
            scheduler.finish_with_status(request, status, error)
        if self.speculator:
            self._apply_proposal(self.speculator.propose(scheduler.running), updates)
        outputs = self.output_processor.process(updates)
        if self._needs_last_tokens:
            self._needs_last_tokens.difference_update(o.request_id for o in outputs if o.finished)
        self._record_step(start, sched)
        return outputs

    def _step_async(self, async_steps: AsyncStepRunner) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        if self.running_step is not None and self._needs_last_tokens:
            outputs = self._finish_running_step()  # some request's next step needs this step's token on the host
        start = self.clock()
        sched = self.scheduler.schedule()
        future = self._guarded(sched, async_steps.submit, sched) if not sched.is_empty else None
        if self.running_step is not None:
            outputs += self._finish_running_step()
        elif future is None and not outputs:
            self._check_not_stalled()
        if isinstance(future, ExecutorOutput):  # preparing it failed: finish it now, failed
            outputs += self._finish_step(start, sched, future)
        elif future is not None:
            self.running_step = (start, sched, future)
        return outputs

    def _finish_running_step(self) -> list[RequestOutput]:
        if self.running_step is None:
            raise RuntimeError("no step is running on the worker")
        start, sched, future = self.running_step
        self.running_step = None
        return self._finish_step(start, sched, self._guarded(sched, future.result))

    def _guarded(self, sched: SchedulerOutput, call, *args):
        """call(*args): the executor's output (or a future of it). A failure no request is to blame for
        (input preparation, the forward) fails every request of the step, and those swapped out by it
        (their KV copy was part of it); the engine stays usable. Failures that belong to some requests
        come back in ExecutorOutput.errors."""
        try:
            return call(*args)
        except RunInvalid:
            raise
        except Exception as e:
            logger.exception("engine step %d failed: failing its %d requests", self.step_count + 1, len(sched.requests))
            message = error_message("the engine step", e)
            swap = self.scheduler.swap
            failed = sched.requests + [r for r in sched.preempted if swap is not None and swap.holds(r)]
            return ExecutorOutput([None] * len(sched.requests), errors={r.request_id: message for r in failed})

    def _apply_proposal(self, proposal: Proposal, updates: StepUpdates) -> None:
        """Drafts for the next step's verification go to the scheduler; a request whose proposal failed ends
        with an error, and its output this step is its final one (one is added if it got no tokens)."""
        self.scheduler.add_drafts(proposal.drafts)
        if not proposal.failed:
            return
        stepped = set(updates.requests)  # identity hashes
        for request, message in proposal.failed:
            self.scheduler.finish_with_status(request, RequestStatus.FINISHED_ERROR, message)
            if request not in stepped:
                updates.append(request, [])

    def _check_not_stalled(self) -> None:
        scheduler = self.scheduler
        if scheduler.num_running == 0 and scheduler.num_waiting:
            # validation guarantees any single request fits: an empty step here is a scheduler bug
            raise RuntimeError(
                f"scheduler stalled with {scheduler.num_waiting} waiting requests "
                f"and {self.kv.num_free_blocks} free blocks"
            )

    def _record_step(self, start: float, sched: SchedulerOutput) -> None:
        # prefilling: not yet at the last known token when scheduled (the scheduler's own decode test);
        # a pure decode step has none, and skips the scan
        prefill_ids = (
            [
                r.request_id
                for r, c, k in zip(sched.requests, sched.num_computed_tokens, sched.num_known_tokens)
                if c < k - 1
            ]
            if sched.num_prefill_tokens
            else []
        )
        self._emit_step(
            start,
            len(sched.requests),
            sched.num_prefill_tokens,
            sched.num_decode_tokens,
            sched.request_ids,
            sched.num_new_tokens,
            prefill_ids,
            list(map(_request_id, sched.preempted)) if sched.preempted else [],
        )

    def _emit_step(
        self,
        start: float,
        num_seqs: int,
        num_prefill_tokens: int,
        num_decode_tokens: int,
        scheduled_ids: list[str],
        scheduled_tokens: list[int],
        prefill_ids: list[str] | None = None,
        preempted_ids: list[str] | None = None,
    ) -> None:
        """Count a step that ran and hand its StepStats to the callbacks."""
        self.step_count += 1
        scheduler = self.scheduler
        kv = self._kv_stats()
        self._last_run = None
        self._last_stats = stats = StepStats(
            self.step_count,
            start,
            self.clock() - start,
            num_seqs,
            num_prefill_tokens,
            num_decode_tokens,
            len(preempted_ids) if preempted_ids else 0,
            scheduler.num_waiting,
            scheduler.num_running,
            kv,
            self.sampler.take_grammar_time(),
            scheduled_ids,
            scheduled_tokens,
            [] if prefill_ids is None else prefill_ids,
            [] if preempted_ids is None else preempted_ids,
        )
        for callback in self.step_callbacks:
            callback(stats)

    def _kv_stats(self) -> KVCacheStats:
        scheduler = self.scheduler
        return self.kv.running_stats(
            scheduler.running, scheduler.running_computed_tokens, self.max_model_len, scheduler.blocked_request
        )

    def _kv_compact(self):
        return kv_compact(self._kv_stats())

    def _emit_run(
        self,
        start_times: list[float],
        end_times: list[float],
        kv: list | CounterSpans,
        scheduled_ids: list[str],
        num_finished: int,
    ) -> None:
        """Count a simulation's decode run (testbed.sim.decode_runs; num_finished: the requests that
        finished in its last step) and hand it to the callbacks: whole to those registered in
        run_callbacks, as one StepStats per step to the others."""
        run = StepRun(
            self.step_count + 1,
            start_times,
            end_times,
            kv,
            self.scheduler.num_waiting,
            scheduled_ids,
            self.sampler.take_grammar_time(),
            num_finished,
        )
        self.step_count += len(run)
        steps = None
        for callback in self.step_callbacks:
            whole = self.run_callbacks.get(callback)
            if whole is not None:
                whole(run)
                continue
            if steps is None:
                steps = run.step_stats()
            for stats in steps:
                callback(stats)
        if steps is None:  # its last StepStats made if someone reads it (most runs are followed by others)
            self._last_run = run
        else:
            self._last_stats, self._last_run = steps[-1], None

    @property
    def last_stats(self) -> StepStats | None:
        """The last step's StepStats (None before the first step)."""
        run = self._last_run
        if run is not None:
            self._last_stats, self._last_run = run.step(len(run) - 1), None
        return self._last_stats

    @property
    def spec_stats(self) -> dict:
        """Speculative decoding counters (empty without speculation)."""
        return self.speculator.stats() if self.speculator else {}

    def close(self) -> None:
        """Release what outlives the engine object: the async-step thread and tensor-parallel workers."""
        if self.async_steps is not None:
            self.async_steps.close()
        self.executor.close()
