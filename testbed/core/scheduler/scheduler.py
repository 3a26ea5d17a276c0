"""The one scheduling mechanism: each step, give requests new tokens to compute within the budgets.

Prefill chunks, decode, prefix hits, speculative verification (1 + k tokens) and preemption (recompute:
back to 0; swap: KV parked in host memory, resumed where it stopped) are all "advance num_computed_tokens";
a SchedulingPolicy only orders requests, picks victims and may shape the step's token budget.

As in vLLM v1, num_computed_tokens advances when a step is scheduled, not when it has run, and a step
that will sample counts an output placeholder until its token is appended. So the next step can be
scheduled while this one runs (async scheduling): a decoding request's next position is known before its
token is, and a request whose in-flight token is its last is not scheduled again.
"""

from testbed.core.sched_output import SchedulerOutput
from testbed.core.scheduler.admission import Admission
from testbed.core.scheduler.finishing import Finishing
from testbed.request import Request


class Scheduler(Admission, Finishing):
    """The step (schedule: running requests first, then admission) over the state every job shares
    (state.SchedulerState); admission and finishing are their own modules."""

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

    def add_drafts(self, drafts: list[tuple[Request, list[int]]]) -> None:
        """Speculative drafts to verify in the next step (the speculator's proposal): each request is given
        1 + len(drafts) tokens then (vLLM v1's update_draft_token_ids)."""
        for request, tokens in drafts:
            if not request.status.finished:
                request.spec_token_ids = tokens
