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
"""

import logging
from collections.abc import Callable

from testbed.detokenize import IncrementalDetokenizer
from testbed.isolation import error_message
from testbed.outputs import RequestOutput
from testbed.request import Request, RequestStatus
from testbed.sequence_group import SequenceGroup
from testbed.stopping import find_stop_string

logger = logging.getLogger(__name__)


class OutputProcessor:
    def __init__(self, tokenizer, finish_request: Callable[..., None]):
        self.tokenizer = tokenizer
        # ends a request from outside the step: (request, status, error message or None), the scheduler's
        self.finish_request = finish_request
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}  # requests with stop strings
        self.groups: dict[str, SequenceGroup] = {}  # parallel-sampling requests in flight, by request id

    def add_group(self, group: SequenceGroup) -> None:
        self.groups[group.request_id] = group

    def process(self, updates: list[tuple[Request, list[int]]]) -> list[RequestOutput]:
        """One output per (request, tokens it got this step); O(1) each unless it has stop strings."""
        outputs = []
        of_request = RequestOutput.of_request
        for request, new_tokens in updates:
            if request.sampling_params.stop and not request.status.finished and self.tokenizer is not None:
                self._check_stop_strings(request)
            if not request.status.finished:
                outputs.append(of_request(request, new_tokens))
                continue
            outputs.append(self.final_output(request, new_tokens))
            if request.group is not None:
                group_output = self._sequence_finished(request.group, outputs[-1])
                if group_output is None and not request.group.forked:  # failed before its siblings started
                    group_output = self._end_unstarted(request.group, request)
                if group_output is not None:
                    outputs.append(group_output)
        return outputs

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

    def abort_group(self, group: SequenceGroup, abort_sequence: Callable[[str], Request | None]) -> RequestOutput:
        """End every unfinished sequence of a group (abort_sequence: the scheduler's abort, by sequence id;
        siblings not yet forked were never in the scheduler) and return the group's final output."""
        final = None
        for seq in group.sequences:
            if seq.is_finished:
                continue
            if abort_sequence(seq.request_id) is None:
                seq.status = RequestStatus.FINISHED_ABORTED
            final = self._sequence_finished(group, self.final_output(seq, [])) or final
        return final if final is not None else group.final_output()

    def _check_stop_strings(self, request: Request) -> None:
        try:
            detok = self._detokenizers.get(request.request_id)
            if detok is None:
                detok = self._detokenizers[request.request_id] = IncrementalDetokenizer(self.tokenizer)
            checked = len(detok.text)
            detok.add(request.output_token_ids[len(detok.token_ids) :], emit=False)
            stop = find_stop_string(detok.text, request.sampling_params.stop, checked)
        except Exception as e:
            self._fail(request, error_message("stop-string detection", e))
            return
        if stop is not None:
            request.stop_reason = stop
            self.finish_request(request, RequestStatus.FINISHED_STOPPED)

    def final_output(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        """The output of a request that has finished (stopped, at its length, aborted or failed), with its text."""
        detok = self._detokenizers.pop(request.request_id, None)
        try:
            text = self._final_text(request, detok)
        except Exception as e:
            self._fail(request, error_message("detokenization", e))
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

    def _fail(self, request: Request, message: str) -> None:
        logger.warning("request %s: %s", request.request_id, message, exc_info=True)
        if request.status.finished:  # already released by the scheduler: only its outcome changes
            request.status, request.error = RequestStatus.FINISHED_ERROR, message
        else:
            self.finish_request(request, RequestStatus.FINISHED_ERROR, message)
            self._detokenizers.pop(request.request_id, None)
