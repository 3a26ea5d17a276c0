"""After the scheduler's update: end requests on stop strings, build each request's RequestOutput.

A request with stop strings keeps an incremental detokenizer (testbed.detokenize, vLLM's offsets scheme),
so each step decodes only its new tokens and searches only the text they could complete; its text is
final, and cut before the stop string, when it ends. Requests without stop strings are decoded once, when
they finish. Token stop rules are the scheduler's (see testbed.stopping for why).

Decoding is per request, so a failure there (a tokenizer that raises on some ids) belongs to its request:
that request ends with FINISHED_ERROR (testbed.isolation) and the others go on. Only the decoding paths
(stop strings, final text) catch; the common step (no stop strings, not finished) has nothing to catch.

Parallel sampling: each sequence of a group gets its outputs as above (carrying the group's id and its index);
the group (testbed.sequence_group) collects its finished sequences, and the step in which the last one ends
also returns the group's final output.

Data flows one way: `find_stops` returns the requests a stop string (or a failed decode) ends, the engine
ends them in the scheduler, and `process` then builds the step's outputs from the requests as they are
(vLLM v1's OutputProcessor likewise returns `reqs_to_abort` for the engine core to apply).
"""

import logging

from testbed.core.step_updates import StepUpdates
from testbed.detokenize import IncrementalDetokenizer
from testbed.isolation import error_message
from testbed.outputs import RequestOutput
from testbed.request import Request, RequestStatus
from testbed.sequence_group import SequenceGroup
from testbed.stopping import find_stop_string

logger = logging.getLogger(__name__)

# a request to end, as decided here: (request, status, error message or None); the engine applies it
Finish = tuple[Request, RequestStatus, str | None]


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}  # requests with stop strings, in flight
        self.groups: dict[str, SequenceGroup] = {}  # parallel-sampling requests in flight, by request id

    def add_request(self, request: Request) -> None:
        """A request entering the engine (each sequence of a group): one with stop strings gets its
        detokenizer, so a step in which no such request is in flight skips the stop-string pass."""
        if request.sampling_params.stop and self.tokenizer is not None:
            self._detokenizers[request.request_id] = IncrementalDetokenizer(self.tokenizer)
        group = request.group
        if group is not None:
            self.groups[group.request_id] = group

    def find_stops(self, updates: StepUpdates) -> list[Finish]:
        """The requests of this step's updates that a stop string ends (or whose decoding failed), in batch
        order; nothing is changed in them beyond their stop_reason. O(1) unless one has stop strings."""
        detokenizers = self._detokenizers
        if not detokenizers:
            return []
        finishes: list[Finish] = []
        for request, _ in updates:
            detok = detokenizers.get(request.request_id)
            if detok is not None and not request.status.finished:
                finish = self._check_stop_strings(request, detok)
                if finish is not None:
                    finishes.append(finish)
        return finishes

    def process(self, updates: StepUpdates) -> list[RequestOutput]:
        """One output per (request, tokens it got this step), after the engine applied find_stops; O(1)
        each unless it finished."""
        return RequestOutput.of_step(updates.requests, updates.new_tokens, self._ended)

    def _ended(self, request: Request, new_tokens: list[int]) -> list[RequestOutput]:
        """A finished request's final output, then its group's final output if this ends the group."""
        output = self.final_output(request, new_tokens)
        group = request.group
        if group is None:
            return [output]
        group_output = self._sequence_finished(group, output)
        if group_output is None and not group.forked:  # failed before its siblings started
            group_output = self._end_unstarted(group, request)
        return [output] if group_output is None else [output, group_output]

    def _sequence_finished(self, group: SequenceGroup, seq_output: RequestOutput) -> RequestOutput | None:
        final = group.sequence_finished(seq_output)
        if final is not None:
            self.groups.pop(group.request_id, None)
        return final

    def _end_unstarted(self, group: SequenceGroup, leader: Request) -> RequestOutput | None:
        """The siblings of a leader that ended before they started (they were never in the scheduler) end
        as it did, error included; the group's final output."""
        final = None
        for seq in group.sequences[1:]:
            seq.status, seq.error, seq.finish_time = leader.status, leader.error, leader.finish_time
            final = self._sequence_finished(group, self.final_output(seq, [])) or final
        return final

    def group_ended(self, group: SequenceGroup) -> RequestOutput:
        """The final output of a group whose sequences have all ended (the engine aborted it): each sequence
        not reported yet gets its final output, then the group's."""
        final = None
        for seq in group.sequences:
            if group.completions[seq.index] is None:
                final = self._sequence_finished(group, self.final_output(seq, [])) or final
        return final if final is not None else group.final_output()

    def _check_stop_strings(self, request: Request, detok: IncrementalDetokenizer) -> Finish | None:
        try:
            checked = len(detok.text)
            detok.add(request.output_token_ids[len(detok.token_ids) :], emit=False)
            stop = find_stop_string(detok.text, request.sampling_params.stop, checked)
        except Exception as e:
            message = error_message("stop-string detection", e)
            logger.warning("request %s: %s", request.request_id, message, exc_info=True)
            self._detokenizers.pop(request.request_id, None)
            return request, RequestStatus.FINISHED_ERROR, message
        if stop is None:
            return None
        request.stop_reason = stop
        return request, RequestStatus.FINISHED_STOPPED, None

    def final_output(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        """The output of a request that has finished (stopped, at its length, aborted or failed), with its
        text. A failure to decode it makes its outcome an error (the request is already released)."""
        detok = self._detokenizers.pop(request.request_id, None)
        try:
            text = self._final_text(request, detok)
        except Exception as e:
            message = error_message("detokenization", e)
            logger.warning("request %s: %s", request.request_id, message, exc_info=True)
            request.status, request.error = RequestStatus.FINISHED_ERROR, message
            text = ""
        return RequestOutput.of_request(request, new_tokens, text)

    def _final_text(self, request: Request, detok: IncrementalDetokenizer | None) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        if isinstance(request.stop_reason, str):
            cut = text.find(request.stop_reason)
            if cut < 0 and detok is not None:  # a whole decode can differ from the incremental one
                text = detok.text
                cut = text.find(request.stop_reason)
            text = text[:cut] if cut >= 0 else text
        return text
