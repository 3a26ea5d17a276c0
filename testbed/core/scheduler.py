"""The one scheduling mechanism: each step, give requests new tokens to compute within the budgets.

Prefill chunks, decode, prefix hits, speculative verification (1 + k tokens) and preemption (recompute:
back to 0; swap: KV parked in host memory, resumed where it stopped) are all "advance num_computed_tokens";
a SchedulingPolicy only orders requests, picks victims and may shape the step's token budget.

As in vLLM v1, num_computed_tokens advances when a step is scheduled, not when it has run, and a step
that will sample counts an output placeholder until its token is appended. So the next step can be
scheduled while this one runs (async scheduling): a decoding request's next position is known before its
token is, and a request whose in-flight token is its last is not scheduled again.
"""

import bisect
import logging
from dataclasses import dataclass
from itertools import count, repeat

from testbed.core.allocators.base import KVAllocator
from testbed.core.group_seats import GroupSeats
from testbed.core.policies import SchedulingPolicy
from testbed.core.sched_output import SchedulerOutput
from testbed.core.step_updates import StepUpdates
from testbed.core.swap import SwapManager
from testbed.request import Request, RequestStatus
from testbed.stopping import append_until_stop, check_token_stop

logger = logging.getLogger(__name__)


@dataclass
class SchedulerLimits:
    """What bounds a step: the engine's scheduler group (testbed.config.SchedulerConfig, which checks them)
    and the model's resolved context."""

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    max_model_len: int = 8192


class Scheduler:
    def __init__(
        self,
        config: SchedulerLimits,
        kv: KVAllocator,
        policy: SchedulingPolicy,
        clock,
        swap: SwapManager | None = None,
    ):
        self.config = config
        self.kv = kv  # any KVAllocator (testbed.core.allocators)
        self.policy = policy
        self.clock = clock
        self.swap = swap  # None: recompute preemption
        self.waiting: list[Request] = []  # sorted by policy key
        self.running: list[Request] = []  # sorted by policy key
        self.requests: dict[str, Request] = {}
        self._next_seq_no = 0
        self._finished_ids: list[str] = []
        self.num_preemptions = 0
        self.blocked_request: Request | None = None  # waiting request refused memory in the last step
        self.seats = GroupSeats()  # parallel sampling: seats held for groups not yet forked
        # sum of num_computed_tokens over self.running, kept as they change: KV accounting in O(1)
        self.running_computed_tokens = 0
        # the policy's per-request chunking rule, or None when it is the default (take what is left)
        overridden = type(policy).token_budget is not SchedulingPolicy.token_budget
        self._token_budget = policy.token_budget if overridden else None
        # the last batch scheduled (a copy) and its ids: steady decoding schedules the same batch every step,
        # and its SchedulerOutput gets the same id list (SchedulerOutput.request_ids)
        self._last_batch: list[Request] = []
        self._last_ids: list[str] = []

    # ---- queue upkeep -------------------------------------------------------------------------
    def _insert(self, queue: list[Request], request: Request, now: float) -> None:
        key = self.policy.key
        bisect.insort(queue, request, key=lambda r: key(r, now))

    def add_request(self, request: Request) -> None:
        request.max_num_tokens = min(request.max_num_tokens, self.config.max_model_len)
        request.seq_no = self._next_seq_no
        self._next_seq_no += 1
        self.requests[request.request_id] = request
        self._insert(self.waiting, request, self.clock())

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def _preempt(self, request: Request, now: float) -> None:
        """Swap the KV out to host memory if swapping is on and it fits; otherwise recompute: drop the KV
        and start over later (prefix cache permitting)."""
        self.running.remove(request)
        self.running_computed_tokens -= request.num_computed_tokens
        self.seats.release(request)
        request.spec_token_ids = []
        if self.swap is None or not self.swap.swap_out(request):
            self.kv.free(request)
            request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._insert(self.waiting, request, now)

    # ---- the step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """There are no prefill or decode phases: each request has num_computed_tokens and tokens it
        knows (prompt + outputs + drafts), and a step gives it new tokens to compute so that the first
        catches up with the second, within the token budget and the sequence cap. Running requests go
        first, in policy order, preempting (policy's victim) when memory runs out; waiting ones are
        admitted after, unless the step preempted. The output carries the step's block-table changes,
        swap copies and finished ids forward to the executor; an empty output keeps them for the next."""
        now = self.clock()
        # the step's ordering is decided here, once, before any sort or insert
        self.policy.begin_step(now, self.waiting, self.requests)
        if self.policy.time_dependent:
            key = self.policy.key
            self.waiting.sort(key=lambda r: key(r, now))
            self.running.sort(key=lambda r: key(r, now))
        out = SchedulerOutput()
        self.blocked_request = None
        budget = min(self.policy.step_budget(self.config.max_num_batched_tokens), self.config.max_num_batched_tokens)
        self._preempt_for_waiting(out, budget, now)
        num_preempted = len(out.preempted)
        budget = self._schedule_running(out, budget, now)
        if len(out.preempted) == num_preempted:  # no memory pressure among the running
            self._schedule_waiting(out, budget, now)
        if out.requests:
            out.finished_ids, self._finished_ids = self._finished_ids, []
            out.block_updates = self.kv.take_block_updates()
            out.kv_copies = self.kv.take_copies()
            if out.requests == self._last_batch:  # identity comparisons (a Request has no __eq__)
                out.ids = self._last_ids
            else:
                self._last_batch, self._last_ids = list(out.requests), out.request_ids
        return out

    def _preempt_for_waiting(self, out: SchedulerOutput, budget: int, now: float) -> None:
        """Let the first waiting request displace running ones the policy ranks below it, while it could
        not otherwise start (no seat or no memory). Preemption at token granularity: any step."""
        while self.waiting and self.running:
            head = self.waiting[0]
            victim = self.policy.should_preempt_for(head, self.running, now)
            if victim is None or self._can_start(head, budget):
                return
            self._preempt(victim, now)
            out.preempted.append(victim)

    def _can_start(self, request: Request, budget: int) -> bool:
        if not self._has_seats(request):
            return False
        computed_blocks, num_cached = self._resume_point(request)
        num_new = min(request.num_tokens - num_cached, self.policy.token_budget(request, budget))
        return self.kv.can_allocate(request, max(num_new, 1), computed_blocks) is not None

    def _resume_point(self, request: Request):
        """(prefix-hit blocks, tokens already computed) for a waiting request: a swapped-out one resumes
        where it stopped, any other one from its longest cached prefix."""
        if self.swap is not None and self.swap.holds(request):
            return [], request.num_computed_tokens
        return self.kv.get_computed_blocks(request)

    def _record(self, out: SchedulerOutput, request: Request, num_new: int) -> None:
        """Schedule num_new tokens of a request admitted from the waiting queue (see _schedule_running)."""
        computed, known = request.num_computed_tokens, len(request.all_token_ids) + request.num_output_placeholders
        out.requests.append(request)
        out.num_new_tokens.append(num_new)
        out.num_computed_tokens.append(computed)
        out.num_known_tokens.append(known)
        if computed >= known - 1:
            out.num_decode_tokens += num_new
        else:
            out.num_prefill_tokens += num_new
        request.num_computed_tokens = computed + num_new
        self.running_computed_tokens += num_new
        if computed + num_new >= known:  # it samples: one output placeholder until update()
            request.num_output_placeholders += 1

    def _schedule_running(self, out: SchedulerOutput, budget: int, now: float) -> int:
        """Running requests in order, each its remaining tokens (1 when decoding, 1 + k with k drafts)
        within the budget. This loop runs for every running request every step, hence the locals and
        the inlined _record; allocate_slots is not called while the held blocks already have room (the
        allocator's slot_limits)."""
        running, allocate, token_budget = self.running, self.kv.allocate_slots, self._token_budget
        slot_limit = self.kv.slot_limits().get
        requests, num_new_tokens = out.requests, out.num_new_tokens
        computed_before, known_before = out.num_computed_tokens, out.num_known_tokens
        num_prefill = num_decode = 0
        i, num_running = 0, len(running)  # changes only when _make_room preempts
        while i < num_running and budget > 0:
            request = running[i]
            computed, placeholders = request.num_computed_tokens, request.num_output_placeholders
            num_tokens = len(request.all_token_ids) + placeholders
            if placeholders and num_tokens >= request.max_num_tokens:
                i += 1  # the token in flight is its last
                continue
            spec = request.spec_token_ids
            num_new = num_tokens + len(spec) - computed if spec else num_tokens - computed
            if token_budget is not None:
                num_new = min(num_new, token_budget(request, budget))
            elif num_new > budget:
                num_new = budget
            if num_new <= 0:
                i += 1
                continue
            if computed + num_new > slot_limit(request.request_id, -1) and allocate(request, num_new) is None:
                made_room = self._make_room(out, request, num_new, i, now)
                num_running = len(running)
                if not made_room:
                    continue  # the request itself was preempted: running[i] is the next one
            requests.append(request)
            num_new_tokens.append(num_new)
            computed_before.append(computed)
            known_before.append(num_tokens)
            if computed >= num_tokens - 1:
                num_decode += num_new
            else:
                num_prefill += num_new
            request.num_computed_tokens = end = computed + num_new
            if end >= num_tokens:  # it samples: one output placeholder until update()
                request.num_output_placeholders = placeholders + 1
            budget -= num_new
            i += 1
        out.num_prefill_tokens += num_prefill
        out.num_decode_tokens += num_decode
        self.running_computed_tokens += num_prefill + num_decode
        return budget

    def _make_room(self, out: SchedulerOutput, request: Request, num_new: int, i: int, now: float) -> bool:
        """Preempt until running[i] gets its slots; False if it was the victim itself."""
        while True:
            # only requests not yet scheduled this step (at or after i) can be victims
            victim = self.policy.choose_victim(self.running[i:], now)
            self._preempt(victim, now)
            out.preempted.append(victim)
            if victim is request:
                return False
            if self.kv.allocate_slots(request, num_new) is not None:
                return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> None:
        while self.waiting and budget > 0 and len(self.running) + self.seats.reserved < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.group is not None and not self._has_seats(request):
                break
            computed_blocks, num_cached = self._resume_point(request)
            num_new = request.num_tokens - num_cached
            if not self.config.enable_chunked_prefill and num_new > budget:
                break
            num_new = min(num_new, self.policy.token_budget(request, budget))
            if num_new <= 0:
                break
            if self.kv.allocate_slots(request, num_new, computed_blocks) is None:
                scheduled = set(out.requests)  # identity hashes: O(1) membership at any batch size
                unscheduled = [r for r in self.running if r not in scheduled]
                victim = self.policy.should_preempt_for(request, unscheduled, now)
                if victim is None:
                    self.blocked_request = request
                    break
                self._preempt(victim, now)
                out.preempted.append(victim)
                continue
            self.waiting.pop(0)
            if self.swap is not None and self.swap.holds(request):
                self.swap.swap_in(request)
            request.num_computed_tokens = num_cached
            self.running_computed_tokens += num_cached
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_cached
                request.first_scheduled_time = now
                self.kv.record_prefix_lookup(request.num_tokens, num_cached, request)
            request.status = RequestStatus.RUNNING
            self._insert(self.running, request, now)
            if request.group is not None and not request.group.forked:
                self.seats.hold(request)
            self._record(out, request, num_new)
            budget -= num_new

    # ---- after the model ran ------------------------------------------------------------------
    def update(
        self,
        out: SchedulerOutput,
        sampled: list[list[int] | None],
        logprobs: list[list[dict] | None] | None = None,
        errors: dict[str, str] | None = None,
    ) -> StepUpdates:
        """Append the step's sampled tokens (its computed counts advanced when it was scheduled) and end the
        requests they finish. Returns (request, new tokens) for every request that got tokens or failed, in
        batch order after the failed ones. A request preempted while the step ran (async scheduling) still
        gets its token, as it would have had the step finished first. `errors` (request id -> message):
        requests the executor could not serve, finished with FINISHED_ERROR before anything of the step
        counts. One pass; a step in which every request got what was sampled for it builds no list."""
        now = self.clock()
        failed = self._finish_failed(out, errors) if errors else []
        finished: list[Request] = []
        computed_delta = 0  # change of running_computed_tokens
        unforked = self.seats.unforked
        max_model_len = self.config.max_model_len
        # (index, tokens it got, None for none) where that is not what was sampled for it
        changed: list[tuple[int, list[int] | None]] = []
        for idx, request, tokens, token_logprobs in zip(count(), out.requests, sampled, logprobs or _NO_LOGPROBS):
            if not tokens:  # mid-prefill
                changed.append((idx, None))
                continue
            status = request.status
            if status.finished:  # aborted (or failed) while the step ran
                changed.append((idx, None))
                continue
            request.num_output_placeholders -= 1
            if unforked and request in unforked:  # a group's leader sampled its first token
                self._fork(request, now)
            if request.spec_token_ids:
                computed_delta -= self._rewind_rejected(request, len(tokens))
            if token_logprobs is None and len(tokens) == 1 and request.first_token_time is not None:
                # the common case (Request.append_output_token inlined, no logprobs, not the first token)
                token = tokens[0]
                all_tokens = request.all_token_ids
                request.output_token_ids.append(token)
                all_tokens.append(token)
                request.token_times.append(now)
                # cheap filter first: only a stop/EOS token or the length limit can end a request
                if token not in request.stop_check_ids and len(all_tokens) < request.max_num_tokens:
                    continue
                check_token_stop(request, token, max_model_len)
            else:
                new_tokens = append_until_stop(request, tokens, token_logprobs, now, max_model_len)
                if new_tokens is not tokens:
                    changed.append((idx, new_tokens))
            if request.status.finished:
                if status is RequestStatus.PREEMPTED:  # preempted while in flight: it waits, not runs, and
                    self.waiting.remove(request)  # its computed tokens are not counted among the running
                else:
                    computed_delta -= request.num_computed_tokens
                    finished.append(request)
                self._release(request, now)
        self.running_computed_tokens += computed_delta
        if finished:  # one pass over the running list, not one per finished request
            done = set(finished)
            self.running[:] = [r for r in self.running if r not in done]
        if not changed and not failed and len(sampled) == len(out.requests):
            return StepUpdates(out.requests, sampled, shared=True)  # type: ignore[arg-type]  # no entry is None here
        return StepUpdates.collect(out.requests, sampled, changed, failed)

    def end_decoded(self, requests: list[Request], token: int) -> None:
        """End running requests whose last token, `token`, was appended outside update(): the step of a
        simulated decode run in which they finish (testbed.sim.decode_runs). As update() ends them: the
        token's stop rule, then each released in this order (its KV freed), then out of the running list."""
        now = self.clock()
        max_model_len = self.config.max_model_len
        for request in requests:
            if not check_token_stop(request, token, max_model_len):
                raise RuntimeError(f"request {request.request_id!r} did not finish with its last token")
            self.running_computed_tokens -= request.num_computed_tokens
            self._release(request, now)
        done = set(requests)
        self.running[:] = [r for r in self.running if r not in done]

    def drop_finished_ids(self) -> None:
        """What a step's schedule() hands its executor (SchedulerOutput.finished_ids), for a simulated
        decode run's steps, which have no executor to hand them to."""
        self._finished_ids = []

    def add_drafts(self, drafts: list[tuple[Request, list[int]]]) -> None:
        """Speculative drafts to verify in the next step (the speculator's proposal): each request is given
        1 + len(drafts) tokens then (vLLM v1's update_draft_token_ids)."""
        for request, tokens in drafts:
            if not request.status.finished:
                request.spec_token_ids = tokens

    # ---- parallel sampling (testbed.sequence_group) -------------------------------------------------
    @property
    def num_reserved_seats(self) -> int:
        return self.seats.reserved

    def _has_seats(self, request: Request) -> bool:
        return len(self.running) + self.seats.reserved + self.seats.needed(request) <= self.config.max_num_seqs

    def _fork(self, leader: Request, now: float) -> None:
        """Start the siblings of a leader that has computed its prompt: each shares the KV of the prompt's first
        L - 1 tokens and computes the last one itself, for its own logits row. They take the seats the leader
        held and its place in the queue order (same arrival, same admission number)."""
        self.seats.release(leader)
        group = leader.group
        group.forked = True
        num_shared = leader.num_prompt_tokens - 1
        for sibling in group.sequences[1:]:
            sibling.seq_no = leader.seq_no
            sibling.max_num_tokens = min(sibling.max_num_tokens, self.config.max_model_len)
            self.kv.fork(leader, sibling, num_shared)
            sibling.num_computed_tokens = num_shared
            sibling.num_cached_tokens = leader.num_cached_tokens
            sibling.first_scheduled_time = leader.first_scheduled_time
            sibling.status = RequestStatus.RUNNING
            self.requests[sibling.request_id] = sibling
            self._insert(self.running, sibling, now)
            self.running_computed_tokens += num_shared

    def _rewind_rejected(self, request: Request, num_sampled: int) -> int:
        """Rejected drafts: their KV is stale, rewind and give surplus blocks back. Count against the drafts
        scheduled this step (the token budget may cut some); unscheduled ones are dropped. Returns how
        many computed tokens were taken back."""
        num_scheduled_drafts = max(0, request.num_computed_tokens - request.num_tokens)
        rejected = num_scheduled_drafts - (num_sampled - 1)
        request.num_computed_tokens -= rejected
        request.spec_token_ids = []
        if rejected:
            self.kv.trim(request, request.num_computed_tokens)
        return rejected

    def _finish(self, request: Request, now: float) -> None:
        if request in self.running:
            self.running.remove(request)
            self.running_computed_tokens -= request.num_computed_tokens
        self._release(request, now)

    def _release(self, request: Request, now: float) -> None:
        """Free what a finished request holds; the caller has taken it out of self.running."""
        self.seats.release(request)  # a group's leader that ended before its siblings started
        request.finish_time = now
        self.kv.free(request)
        if self.swap is not None:
            self.swap.discard(request)
        self.requests.pop(request.request_id, None)
        self._finished_ids.append(request.request_id)

    def _finish_failed(self, out: SchedulerOutput, errors: dict[str, str]) -> list[tuple[Request, list[int]]]:
        """End the requests a step failed for, freed like any finished request. Their blocks from the
        first one this step wrote on leave the prefix cache: a failed step may not have written that KV."""
        failed: list[tuple[Request, list[int]]] = []
        computed_before = {r.request_id: c for r, c in zip(out.requests, out.num_computed_tokens)}
        for request_id, message in errors.items():
            request = self.requests.get(request_id)
            if request is None or request.status.finished:
                continue  # aborted while the step ran
            self.kv.uncache_from(request, computed_before.get(request_id, request.num_computed_tokens))
            self.finish_with_status(request, RequestStatus.FINISHED_ERROR, message)
            failed.append((request, []))
        return failed

    def finish_with_status(self, request: Request, status: RequestStatus, error: str | None = None) -> None:
        """End a request from outside the step (abort, stop string, a failure: `error` says what failed)."""
        if error is not None:
            request.error = error
            logger.warning("request %s failed: %s", request.request_id, error)
        request.status = status
        if request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, self.clock())

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        self.finish_with_status(request, RequestStatus.FINISHED_ABORTED)
        return request


_NO_LOGPROBS = repeat(None)  # update's logprobs when the step computed none
