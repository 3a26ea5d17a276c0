"""Finishing: after the model ran, the step's sampled tokens appended and the requests they end released
(their KV freed, their ids handed to the next SchedulerOutput); requests ended from outside the step
(abort, stop string, a failure) and by a simulated decode run the same way."""

import logging
from itertools import count, repeat

from testbed.core.sched_output import SchedulerOutput
from testbed.core.scheduler.state import SchedulerState
from testbed.core.step_updates import StepUpdates
from testbed.request import Request, RequestStatus
from testbed.stopping import append_until_stop, check_token_stop

logger = logging.getLogger("testbed.core.scheduler")  # one logger for the scheduler, whichever module logs


class Finishing(SchedulerState):
    """Requests' tokens appended after a step; requests ended, what they hold freed (_release)."""

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
