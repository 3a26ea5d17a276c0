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
`horizon` (the caller adds a request then), and one whose allocations the free blocks could not all
satisfy (the scheduler would preempt). A step in which requests finish (their length: a run's token is
never a stop token) is not in a run that is not planned (_run_stepwise); a planned run takes it as its
last step, ends the requests as the scheduler's update does (their blocks freed in the same order) and
records the step with the run (a StepRun's last step may end requests: its num_running and cache state
are those after the ends); the finished requests go back to the engine for their outputs. If the caller
may send on a finish (Engine.step's sends_on_finish) the run ends there, the caller getting them at that
step's end as from the step alone; else the next run, of the requests left, follows at once.
What is not eligible at all (then nothing is skipped): waiting requests, drafts, parallel-sampling groups,
stop strings, a policy whose order or budget can change between steps (time_dependent, or one that
overrides begin_step / step_budget / token_budget), a recorded run's clock (replay_steps). The equality
with stepping one by one (summary, per-request rows, every step row, the block-access stream) is tested in
tests/sim/test_decode_runs.py; `executor.skip_steps=false` turns skipping off.
"""

import heapq
import math
from bisect import bisect_left
from itertools import accumulate

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
        """emit_run(start_times, end_times, kv, scheduled_ids, num_finished): the engine's record of the
        run's steps (Engine._emit_run; num_finished: the requests that finished in its last step);
        kv_stats(): the cache's state as the engine reports it after a step (testbed.step_stats.kv_compact)."""
        self.scheduler = scheduler
        self.kv = kv
        self.executor = executor
        self.emit_run = emit_run
        self.kv_stats = kv_stats
        self.num_skipped = 0  # steps advanced here (also counted in the engine's step_count)
        self.num_out_of_blocks = 0  # runs that ended where the free blocks ran out
        self.num_finishing = 0  # steps advanced here in which requests finished
        self._last_price = 0.0  # the first step's price in the last planned run (how long its blocks are)
        self._steady_policy = _steady(scheduler.policy)
        self._paged = isinstance(kv, PagedAllocator)
        # the paged allocator's decode allocation as _run_planned plans it
        self._planned_allocator = self._paged and all(
            getattr(type(kv), name) is getattr(PagedAllocator, name)
            for name in (
                "allocate_slots",
                "decode_slot",
                "decode_slots",
                "plan_decode",
                "_set_fast_limit",
                "_cache_full_blocks",
                "blocks_needed",
                "counters",
                "compact_stats",
                "counter_spans",
            )
        )
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

    def _eligible(self, each_checked: bool = False) -> int:
        """How many decode steps may run before the first in which some request finishes (its last token);
        -1: none eligible now. each_checked: the running requests are those a planned run left after ending
        the ones that finished in its last step, each found eligible before it, and nothing a run changes
        can make one ineligible (its tokens and computed tokens advance together): only their lengths are
        read."""
        sched, ex = self.scheduler, self.executor
        if not self._steady_policy or sched.waiting or not sched.running or ex.cost_model is None:
            return -1
        if ex.recorded is not None or ex.speculator is not None or sched.seats.reserved:
            return -1
        running, token = sched.running, ex.token_id
        if len(running) > sched.config.max_num_batched_tokens:
            return -1
        if each_checked:
            return max(min(r.max_num_tokens - len(r.all_token_ids) for r in running) - 1, 0)
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
                return -1
            left = r.max_num_tokens - n - 1  # steps before the one that gives its last token
            if steps is None or left < steps:
                steps = left
        return -1 if steps is None else max(steps, 0)

    def run(self, horizon: float, ended: list | None = None, past_finishes: bool = True) -> int:
        """Advance decode steps while each would start before `horizon`; returns how many ran. `ended`: a
        list for the requests that finish in the run, in the order they finish: the run then takes the
        steps in which requests finish (planned runs only: _finish), going on past them (`past_finishes`)
        or ending with the first; None: it stops before the first such step."""
        if type(self.executor.clock) is not VirtualClock:  # its time is read and moved here directly
            return 0
        total = 0
        each_checked = False
        while True:
            left = self._eligible(each_checked)
            # with `ended`, step `left` (the first in which a request finishes) may be the run's last
            max_steps = left + 1 if ended is not None and left >= 0 else left
            if max_steps <= 0:
                return total
            if self._plannable():
                ran = self._run_planned(horizon, max_steps, ended)
                if ran is not None:
                    total += ran
                    if ran == max_steps and ended is not None and past_finishes:
                        each_checked = True
                        continue  # it ended with a step in which requests finished: the next run, of the others
                    return total
            if left <= 0:
                return total
            return total + self._run_stepwise(horizon, left)

    def _finish(self, running: list, ended: list) -> int:
        """The run's last step, one in which requests finish (their last token; the run made its
        allocations, price and tokens): ended as the engine's update ends them (Scheduler.end_decoded),
        appended to `ended` in batch order; returns how many."""
        done = [r for r in running if len(r.all_token_ids) >= r.max_num_tokens]
        if not done:
            raise RuntimeError("decode run: no request finished in the step planned to finish one")
        self.scheduler.end_decoded(done, self.executor.token_id)
        ended += done
        self.num_finishing += 1
        return len(done)

    def _plannable(self) -> bool:
        """Whether a run's allocations can be planned ahead: the paged allocator's own decode allocation,
        whose only effect on a step's price would be host-tier copies (none here), and its counters'
        cache state."""
        kv, ex = self.kv, self.executor
        return (
            self._planned_allocator
            and self._compact_stats is not None
            and ex.copy_cost is None
            and kv.host_tier is None
            and kv.pool.on_evict is None
            and not kv.req_may_share
        )

    def _run_planned(self, horizon: float, max_steps: int, ended: list | None = None) -> int | None:
        """The run as _run_stepwise makes it, planned instead of found step by step: the step times first
        (the steps starting before `horizon`, summed in the same order), then where each request's
        allocations fall (PagedAllocator.plan_decode: the steps at which its fast limit is passed, a block
        filled or a new one needed, as allocate_slots would move its counts); the run ends before the
        first step whose new blocks the free ones cannot all cover (they only shrink during a run:
        nothing is freed, nothing admitted). Then the allocations are made as in step and batch order
        (PagedAllocator.decode_slots: allocate_slots' one-token path, at once), checked against the plan,
        and the cache state noted after each step from the counters at the steps that took blocks. None
        (nothing changed) where the plan does not apply: a negative price, or a request the allocator's
        fast path does not decide (plan_decode). With `ended`, step max_steps - 1 is one in which
        requests finish: if the run gets there, _finish ends them (into `ended`), and the run is recorded
        with it."""
        sched, kv, ex = self.scheduler, self.kv, self.executor
        clock, token = ex.clock, ex.token_id
        running = list(sched.running)
        n = len(running)
        base = [len(r.all_token_ids) for r in running]
        # the step times: priced a block of steps at a time, summed one by one (the blocks change nothing)
        prices: list[float] = []
        ends: list[float] = []
        context = sum(base)
        first_start = now = clock.now
        steps = 0
        # the first block: about as many steps as fit before the horizon at the last run's first price (a
        # guess; the next block follows if the run goes on)
        room = (horizon - now) / self._last_price if self._last_price > 0 else math.inf
        count = min(max_steps, max(int(room * 1.05) + 2, 1) if room < 30 else 32)
        while True:
            chunk = ex.cost_model.decode_step_times(n, context + steps * n, count)
            if min(chunk) < 0:
                return None  # _run_stepwise refuses it at its step, if the run gets there
            prices += chunk
            times = list(accumulate(chunk, initial=now))  # times[k]: step k's start, times[k + 1] its end
            late = bisect_left(times, horizon, 0, count)  # the first step starting at or after horizon
            ends += times[1 : late + 1]
            steps += late
            now = times[late]
            if late < count or steps >= max_steps:
                break
            count = min(max_steps - steps, max(32, steps))
        self._last_price = prices[0]
        if steps == 0:
            return 0
        # the allocations: where blocks are taken and registered (step * n + position keys)
        plan = kv.plan_decode(running, base, steps)
        if plan is None:
            return None
        fit, takes, registers = plan
        if fit < steps:  # stop before the step whose new blocks are not all there
            steps = fit
            self.num_out_of_blocks += 1
            if steps == 0:
                return 0
        finish = ended is not None and steps == max_steps
        noted_steps = steps - 1 if finish else steps  # a finishing step's cache state is noted after its frees
        run_tokens, run_times = [token] * steps, ends[:steps]
        for r in running:
            r.output_token_ids.extend(run_tokens)
            r.all_token_ids.extend(run_tokens)
            r.token_times.extend(run_times)
        # the run's allocations (step and batch order), then the cache's state after each step: its
        # counters change only at the steps that take a block
        before = kv.counters()
        taken = kv.decode_slots(running, base, takes, registers, n)
        computed = sched.running_computed_tokens  # before the run; after step j: computed + (j + 1) * n
        kv_after = kv.counter_spans(n)  # the cache's state after each step
        noted, counters = 0, before
        for j, after in taken:
            if j >= noted_steps:
                break
            kv_after.add(j - noted, computed + (noted + 1) * n, counters)  # nothing when j == noted
            noted, counters = j, after
        kv_after.add(noted_steps - noted, computed + (noted + 1) * n, counters)
        computed += steps * n
        limits = kv.req_fast_limit
        ids = []
        for r, first in zip(running, base):
            rid = r.request_id
            if limits[rid] - first + 1 < steps:
                raise RuntimeError(f"decode run: {rid} needs an allocation the plan did not make")
            r.num_computed_tokens = first - 1 + steps
            ids.append(rid)
        # what schedule() takes each step (_run_stepwise: at step 0 and at each allocation)
        kv.drop_block_updates()
        kv.take_copies()
        sched.drop_finished_ids()
        sched.running_computed_tokens = computed
        simulated = ex.simulated_seconds
        for dt in prices[:steps]:
            simulated += dt
        ex.simulated_seconds = simulated
        ex.num_steps += steps
        clock.now = ends[steps - 1]
        self.num_skipped += steps
        finished = 0
        if finish and ended is not None:
            finished = self._finish(running, ended)
            kv_after.add(1, sched.running_computed_tokens, kv.counters())  # after its frees, as the engine notes it
        self.emit_run([first_start, *ends[: steps - 1]], run_times, kv_after, ids, finished)
        return steps

    def _run_stepwise(self, horizon: float, max_steps: int) -> int:
        """The run found step by step: per step, the allocations due (a heap of each request's next), the
        price, the clock and the cache's state."""
        sched, kv, ex = self.scheduler, self.kv, self.executor
        clock, cost_model, token, kv_stats = ex.clock, ex.cost_model, ex.token_id, self.kv_stats
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
                    self.num_out_of_blocks += 1
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
        self.emit_run(starts, ends, kv_after, [r.request_id for r in running], 0)
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
