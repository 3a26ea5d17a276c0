"""Admission: waiting requests into the running set (prefix lookups, a swapped-out request's resume point,
the policy's chunk of the budget, parallel sampling's seats), and a waiting request displacing running
ones the policy ranks below it."""

from testbed.core.sched_output import SchedulerOutput
from testbed.core.scheduler.state import SchedulerState
from testbed.request import Request, RequestStatus


class Admission(SchedulerState):
    """Waiting requests into the running set; a step admits only after the running requests had theirs
    (Scheduler.schedule)."""

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
        """Schedule num_new tokens of a request admitted from the waiting queue (see Scheduler._schedule_running)."""
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

    def _has_seats(self, request: Request) -> bool:
        return len(self.running) + self.seats.reserved + self.seats.needed(request) <= self.config.max_num_seqs
