"""After the scheduler's update: end requests on stop strings, build each request's RequestOutput.

A request with stop strings keeps an incremental detokenizer (testbed.detokenize, vLLM's offsets scheme),
so each step decodes only its new tokens and searches only the text they could complete; its text is
final, and cut before the stop string, when it ends. Requests without stop strings are decoded once, when
they finish. Token stop rules are the scheduler's (see testbed.stopping for why).

Decoding is per request, so a failure there (a tokenizer that raises on some ids) belongs to its request:
that request ends with FINISHED_ERROR (testbed.isolation) and the others go on. Only the decoding paths
(stop strings, final text) catch; the common step (no stop strings, not finished) has nothing to catch.
"""

import logging
from collections.abc import Callable

from testbed.detokenize import IncrementalDetokenizer
from testbed.isolation import error_message
from testbed.outputs import RequestOutput
from testbed.request import Request, RequestStatus
from testbed.stopping import find_stop_string

logger = logging.getLogger(__name__)


class OutputProcessor:
    def __init__(self, tokenizer, finish_request: Callable[..., None]):
        self.tokenizer = tokenizer
        # ends a request from outside the step: (request, status, error message or None), the scheduler's
        self.finish_request = finish_request
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}  # requests with stop strings

    def process(self, updates: list[tuple[Request, list[int]]]) -> list[RequestOutput]:
        """One output per (request, tokens it got this step); O(1) each unless it has stop strings."""
        outputs = []
        of_request = RequestOutput.of_request
        for request, new_tokens in updates:
            if request.sampling_params.stop and not request.status.finished and self.tokenizer is not None:
                self._check_stop_strings(request)
            outputs.append(
                self.final_output(request, new_tokens) if request.status.finished else of_request(request, new_tokens)
            )
        return outputs

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
