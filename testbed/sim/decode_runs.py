"""Step skipping for the simulator: a run of pure decode steps advanced in one go, equal to stepping.

Between events, a simulated engine's steps have a known shape: when nothing is waiting, every running
request decodes one token per step, no request finishes and no new one arrives, each step schedules the
same requests in the same order, its cost is the cost model's price of a decode batch whose KV context
grows by one token per request, and each request gets the fixed token at the step's end time. This module
advances such a run without the per-step scheduler, executor and output passes: it prices the steps
(the cost model's decode_step_times, a block of steps at a time), and per step moves the clock, makes the
KV allocations the scheduler would (in the same order, at the same step: a request crossing into a new
block, or filling one that is registered for prefix caching) and notes the cache's state; the requests'
token lists and times are extended once at the end, and the engine records the run whole
(testbed.step_stats.StepRun: what each step's StepStats would have said).

The run stops before any step that could differ from the run's shape: one that would start at or after
`horizon` (the caller adds a request then), one in which a request would finish (its length, or a stop
token), and one whose allocations the free blocks could not all satisfy (the scheduler would preempt).
What is not eligible at all (then nothing is skipped): waiting requests, drafts, parallel-sampling groups,
stop strings, a policy whose order or budget can change between steps (time_dependent, or one that
overrides begin_step / step_budget / token_budget), a recorded run's clock (replay_steps). The equality
with stepping one by one (summary, per-request rows, every step row, the block-access stream) is tested in
tests/sim/test_decode_runs.py; `executor.skip_steps=false` turns skipping off.
"""

import heapq

from testbed.core.allocators.paged import PagedAllocator
from testbed.core.policies.base import SchedulingPolicy
from testbed.request import RequestStatus
from testbed.sim.clock import VirtualClock


def _steady(policy: SchedulingPolicy) -> bool:
    """A policy whose order and budgets stay the same while nothing arrives or finishes."""
    cls = type(policy)
    return (
        not policy.time_dependent
        and cls.begin_step is SchedulingPolicy.begin_step
        and cls.step_budget is SchedulingPolicy.step_budget
        and cls.token_budget is SchedulingPolicy.token_budget
    )


class DecodeRuns:
    def __init__(self, scheduler, kv, executor, emit_run, kv_stats):
        """emit_run(start_times, end_times, kv): the engine's record of the run's steps; kv_stats(): the
        cache's state as the engine reports it after a step (testbed.step_stats.kv_compact)."""
        self.scheduler = scheduler
        self.kv = kv
        self.executor = executor
        self.emit_run = emit_run
        self.kv_stats = kv_stats
        self.num_skipped = 0  # steps advanced here (also counted in the engine's step_count)
        self._steady_policy = _steady(scheduler.policy)
        self._paged = isinstance(kv, PagedAllocator)
        # the paged cache's state after a step, from its counters as a tuple (what kv_stats gives, without
        # the stats object), unless a subclass reports it differently
        cls = type(kv)
        self._compact_stats = (
            kv.compact_stats
            if self._paged
            and cls.running_stats is PagedAllocator.running_stats
            and cls.stats_from_counters is PagedAllocator.stats_from_counters
            else None
        )

    def _eligible(self) -> int:
        """How many decode steps may run before some request finishes (0: none eligible now)."""
        sched, ex = self.scheduler, self.executor
        if not self._steady_policy or sched.waiting or not sched.running or ex.cost_model is None:
            return 0
        if ex.recorded is not None or ex.speculator is not None or sched.seats.reserved:
            return 0
        running, token = sched.running, ex.token_id
        if len(running) > sched.config.max_num_batched_tokens:
            return 0
        steps = None
        for r in running:
            n = len(r.all_token_ids)
            if (
                r.num_computed_tokens != n - 1
                or r.num_output_placeholders
                or r.spec_token_ids
                or r.group is not None
                or r.status is not RequestStatus.RUNNING
                or r.first_token_time is None
                or r.sampling_params.stop
                or token in r.stop_check_ids
            ):
                return 0
            left = r.max_num_tokens - n - 1  # steps before the one that gives its last token
            if steps is None or left < steps:
                steps = left
        return max(steps or 0, 0)

    def run(self, horizon: float) -> int:
        """Advance decode steps while each would start before `horizon`; returns how many ran."""
        sched, kv, ex = self.scheduler, self.kv, self.executor
        clock, cost_model, token, kv_stats = ex.clock, ex.cost_model, ex.token_id, self.kv_stats
        if type(clock) is not VirtualClock:  # its time is read and moved here directly
            return 0
        max_steps = self._eligible()
        if max_steps <= 0:
            return 0
        compact = self._compact_stats
        running = list(sched.running)
        n = len(running)
        base = [len(r.all_token_ids) for r in running]  # known tokens when the run starts
        limits = kv.slot_limits()
        # (first run step at which the request needs allocate_slots, its position in the batch)
        events = [(limits.get(r.request_id, -1) - base[i] + 1, i) for i, r in enumerate(running)]
        heapq.heapify(events)
        materialized = [0] * n  # run tokens already appended to each request
        starts: list[float] = []
        ends: list[float] = []  # the clock after each step: the time of the token it gave
        kv_after: list = []
        prices: list[float] = []  # the cost model's price of step j (without host-tier copies)
        context = sum(base)  # decode_context of the first step: each request attends to its known tokens
        next_event = 0  # the first step that may allocate (step 0 also takes what the last update left)
        simulated = ex.simulated_seconds
        now = clock.now
        j = 0
        while j < max_steps:
            start = now
            if start >= horizon:
                break
            copies = None
            if next_event <= j:
                due = []
                while events and events[0][0] <= j:
                    due.append(heapq.heappop(events)[1])
                if due and not self._allocate(running, base, due, j, ends, materialized, token):
                    for i in due:
                        heapq.heappush(events, (j, i))
                    break
                # what schedule() takes each step: block-table changes (nothing reads them in a
                # simulation) and block copies (the host KV tier's, priced as the executor prices them);
                # only allocations make either during a run
                kv.drop_block_updates()
                copies = kv.take_copies()
                for i in due:
                    limit = limits.get(running[i].request_id, -1)
                    heapq.heappush(events, (max(limit - base[i] + 1, j + 1), i))
                next_event = events[0][0] if events else max_steps
            if j == len(prices):  # priced in blocks: most runs end at the next arrival
                count = min(max_steps - j, max(32, j))
                prices.extend(cost_model.decode_step_times(n, context + j * n, count))
            dt = prices[j]
            if copies and ex.copy_cost is not None:
                dt += ex.copy_cost.extra_time(copies, dt)
            if dt < 0:
                clock.advance(dt)  # refuses it
            sched.running_computed_tokens += n
            now += dt
            clock.now = now
            simulated += dt
            starts.append(start)
            ends.append(now)
            kv_after.append(compact(sched.running_computed_tokens) if compact is not None else kv_stats())
            j += 1
        if j == 0:
            return 0
        ex.num_steps += j
        ex.simulated_seconds = simulated
        for i, r in enumerate(running):
            self._materialize(r, materialized, i, j, ends, token)
            r.num_computed_tokens = base[i] - 1 + j
        self.num_skipped += j
        self.emit_run(starts, ends, kv_after)
        return j

    def _allocate(self, running, base, due, j, times, materialized, token) -> bool:
        """The allocations step j's schedule makes, in batch order; False (nothing changed) if the free
        blocks cannot cover them all."""
        kv = self.kv
        due.sort()
        for i in due:
            r = running[i]
            r.num_computed_tokens = base[i] - 1 + j
            self._materialize(r, materialized, i, j, times, token)
        # the paged allocator gives a decoding request at most one block per token (no fork: no copies)
        if not (self._paged and len(due) <= kv.num_free_blocks):
            need = 0
            for i in due:
                blocks = kv.can_allocate(running[i], 1)
                if blocks is None:
                    return False
                need += blocks
            if need > kv.num_free_blocks:
                return False
        for i in due:
            if kv.allocate_slots(running[i], 1) is None:  # cannot happen after the check above
                raise RuntimeError(f"decode run: allocation failed for {running[i].request_id} after its check")
        return True

    @staticmethod
    def _materialize(request, materialized, i, upto, times, token) -> None:
        """Append the run's tokens request i got in steps [materialized[i], upto), with their times."""
        have = materialized[i]
        if upto > have:
            k = upto - have
            request.output_token_ids.extend([token] * k)
            request.all_token_ids.extend([token] * k)
            request.token_times.extend(times[have:upto])
            materialized[i] = upto
