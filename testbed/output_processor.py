"""After the scheduler's update: end requests on stop strings, build each request's RequestOutput.

A request with stop strings keeps an incremental detokenizer (testbed.detokenize, vLLM's offsets scheme),
so each step decodes only its new tokens and searches only the text they could complete; its text is
final, and cut before the stop string, when it ends. Requests without stop strings are decoded once, when
they finish. Token stop rules are the scheduler's (see testbed.stopping for why).
"""

from collections.abc import Callable

from testbed.detokenize import IncrementalDetokenizer
from testbed.outputs import RequestOutput
from testbed.request import Request, RequestStatus
from testbed.stopping import find_stop_string


class OutputProcessor:
    def __init__(self, tokenizer, finish_request: Callable[[Request, RequestStatus], None]):
        self.tokenizer = tokenizer
        self.finish_request = finish_request  # ends a request from outside the step (the scheduler's)
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
        detok = self._detokenizers.get(request.request_id)
        if detok is None:
            detok = self._detokenizers[request.request_id] = IncrementalDetokenizer(self.tokenizer)
        checked = len(detok.text)
        detok.add(request.output_token_ids[len(detok.token_ids) :], emit=False)
        stop = find_stop_string(detok.text, request.sampling_params.stop, checked)
        if stop is not None:
            request.stop_reason = stop
            self.finish_request(request, RequestStatus.FINISHED_STOPPED)

    def final_output(self, request: Request, new_tokens: list[int]) -> RequestOutput:
        """The output of a request that has finished (stopped, at its length, or aborted), with its text."""
        detok = self._detokenizers.pop(request.request_id, None)
        text = ""
        if self.tokenizer is not None:
            text = self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
            if isinstance(request.stop_reason, str):
                cut = text.find(request.stop_reason)
                if cut < 0 and detok is not None:  # a whole decode can differ from the incremental one
                    text = detok.text
                    cut = text.find(request.stop_reason)
                text = text[:cut] if cut >= 0 else text
        return RequestOutput.of_request(request, new_tokens, text)
