"""What the engine returns: vLLM's RequestOutput / CompletionOutput shape.

The engine builds one RequestOutput per request that made progress, every step, so building one is
O(1): it records counts, not copies, of the request's token lists (which only ever grow), and its
completion and metrics objects are made when first read; token ids and logprobs are copied out of the
request's lists when first read. Reading an output gives the state at the step that returned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.request import Request


class CompletionOutput:
    __slots__ = (
        "index",
        "text",
        "finish_reason",
        "stop_reason",
        "_token_ids",
        "_num_tokens",
        "_logprobs",
        "_num_logprobs",
        "cumulative_logprob",
    )
    _num_tokens: int | None  # None: _token_ids is the value itself, else its first _num_tokens
    _num_logprobs: int | None

    def __init__(
        self,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[dict] | None = None,  # per token {token id: Logprob} (testbed.executor.logprobs)
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        cumulative_logprob: float | None = None,
    ):
        self.index = index  # the sequence's index in its request (parallel sampling: 0..best_of-1)
        self.text = text
        self.finish_reason = finish_reason  # "stop" | "length" | "abort" | "error" | None while running
        self.stop_reason = stop_reason
        # sum of the sampled tokens' raw logprobs; None when the sequence computed no logprobs (vLLM's)
        self.cumulative_logprob = cumulative_logprob
        self._token_ids, self._num_tokens = token_ids, None  # None: the list is the value itself
        self._logprobs, self._num_logprobs = logprobs, None

    @classmethod
    def prefix_of(
        cls,
        index: int,
        text: str,
        token_ids: list[int],
        num_tokens: int,
        logprobs: list[dict] | None,
        num_logprobs: int | None,
        finish_reason: str | None,
        stop_reason: int | str | None,
        cumulative_logprob: float | None = None,
    ):
        """A completion of the first num_tokens token ids (num_logprobs logprobs) of lists that only grow,
        copied out when first read."""
        out = cls(index, text, token_ids, logprobs, finish_reason, stop_reason, cumulative_logprob)
        out._num_tokens, out._num_logprobs = num_tokens, num_logprobs
        return out

    @property
    def token_ids(self) -> list[int]:
        if self._num_tokens is not None:  # first read: copy the prefix out
            self._token_ids, self._num_tokens = self._token_ids[: self._num_tokens], None
        return self._token_ids

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        self._token_ids, self._num_tokens = value, None

    @property
    def logprobs(self) -> list[dict] | None:
        if self._num_logprobs is not None and self._logprobs is not None:  # a count comes with its list
            self._logprobs, self._num_logprobs = self._logprobs[: self._num_logprobs], None
        return self._logprobs

    @logprobs.setter
    def logprobs(self, value: list[dict] | None) -> None:
        self._logprobs, self._num_logprobs = value, None

    def _fields(self) -> tuple:
        return (
            self.index,
            self.text,
            self.token_ids,
            self.logprobs,
            self.finish_reason,
            self.stop_reason,
            self.cumulative_logprob,
        )

    def __eq__(self, other) -> bool:
        return isinstance(other, CompletionOutput) and self._fields() == other._fields()

    # __eq__ without __hash__ leaves it unhashable: mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        return (
            f"CompletionOutput(index={self.index}, text={self.text!r}, token_ids={self.token_ids}, "
            f"cumulative_logprob={self.cumulative_logprob}, logprobs={self.logprobs}, "
            f"finish_reason={self.finish_reason!r}, stop_reason={self.stop_reason!r})"
        )


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0


class RequestOutput:
    """One request's state after a step: vLLM's RequestOutput.

    The engine makes these with `RequestOutput.of_request`, which records only what may still change in
    the request (how many tokens it has, its finish state, its preemption count) and builds `outputs`
    and `metrics` from it when first read: most outputs of a busy step are never looked at.

    Parallel sampling (testbed.sequence_group): a sequence's output carries the group's request id, its one
    completion has the sequence's index, and `finished` stays False (the completion's finish_reason says
    when the sequence ended); the group's last output is finished and holds every returned completion."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "finished",
        "new_token_ids",
        "prompt",
        "prompt_logprobs",
        "_outputs",
        "_metrics",
        # of_request's record of the request as it was (None: built from explicit outputs): flat fields,
        # not one tuple, so an output is one allocation
        "_request",
        "_num_tokens",
        "_num_logprobs",
        "_finish",
        "_text",
        "_num_preemptions",
        "_cumulative",
    )
    _outputs: list[CompletionOutput] | None
    _metrics: RequestMetrics | None
    _request: Request | None
    _num_tokens: int
    _num_logprobs: int | None
    _finish: str | None
    _text: str
    _num_preemptions: int
    _cumulative: float | None

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        outputs: list[CompletionOutput],
        finished: bool,
        new_token_ids: list[int] | None = None,
        metrics: RequestMetrics | None = None,
        prompt: str | None = None,
        prompt_logprobs: list | None = None,
    ):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.finished = finished
        self.new_token_ids = [] if new_token_ids is None else new_token_ids  # produced by the step returning this
        self.prompt = prompt
        self.prompt_logprobs = prompt_logprobs  # per prompt token {token id: Logprob}, the first None
        self._outputs, self._metrics, self._request = outputs, metrics, None

    @classmethod
    def of_request(cls, request, new_token_ids: list[int], text: str = "") -> RequestOutput:
        """The output for an engine Request (testbed.request) as it is now, in O(1). Its token lists only
        grow and its timestamps are set once, so a count and the few fields that still change suffice."""
        out = cls.__new__(cls)
        out.request_id, out.prompt_token_ids = request.output_id, request.prompt_token_ids
        status = request.status
        out.finished, out.new_token_ids, out.prompt = status.finished and request.group is None, new_token_ids, None
        out.prompt_logprobs = request.prompt_logprobs  # complete once the prompt is computed
        out._outputs = out._metrics = None
        out._request, out._num_tokens = request, len(request.output_token_ids)
        out._num_logprobs = len(request.output_logprobs) if request.returns_logprobs else None
        out._finish, out._text = (status.value if status.finished else None), text
        out._num_preemptions = request.num_preemptions
        out._cumulative = request.cumulative_logprob if request.computes_logprobs else None
        return out

    @classmethod
    def of_step(cls, requests: list, new_tokens: list[list[int]], ended) -> list[RequestOutput]:
        """The outputs of a step, in batch order: of_request for each request still running (no finish
        reason, no text yet: the output of almost every request in almost every step, so its fields are
        set here in one loop), and what `ended(request, its new tokens)` returns (a list) for each that
        finished."""
        outputs: list[RequestOutput] = []
        append = outputs.append
        new = cls.__new__
        for request, tokens in zip(requests, new_tokens):
            if request.status.finished:
                outputs += ended(request, tokens)
                continue
            out = new(cls)
            out.request_id, out.prompt_token_ids, out.finished = request.output_id, request.prompt_token_ids, False
            out.new_token_ids, out.prompt, out.prompt_logprobs = tokens, None, request.prompt_logprobs
            out._outputs = out._metrics = out._finish = None
            out._request, out._num_tokens, out._text = request, len(request.output_token_ids), ""
            out._num_logprobs = len(request.output_logprobs) if request.returns_logprobs else None
            out._num_preemptions = request.num_preemptions
            out._cumulative = request.cumulative_logprob if request.computes_logprobs else None
            append(out)
        return outputs

    @property
    def outputs(self) -> list[CompletionOutput]:
        outputs = self._outputs
        if outputs is None:  # made from the request, when first read
            request = self._request
            if request is None:
                raise RuntimeError(f"output of {self.request_id!r} has neither completions nor a request")
            num_logprobs, finish = self._num_logprobs, self._finish
            outputs = self._outputs = [
                CompletionOutput.prefix_of(
                    request.index,
                    self._text,
                    request.output_token_ids,
                    self._num_tokens,
                    request.output_logprobs if num_logprobs is not None else None,
                    num_logprobs,
                    finish,
                    request.stop_reason if finish is not None else None,
                    self._cumulative,
                )
            ]
        return outputs

    @outputs.setter
    def outputs(self, value: list[CompletionOutput]) -> None:
        self._outputs = value

    @property
    def error(self) -> str | None:
        """Why the request failed, when it finished with finish_reason "error" (else None)."""
        return self._request.error if self._request is not None and self._finish == "error" else None

    @property
    def metrics(self) -> RequestMetrics | None:
        request = self._request
        if self._metrics is None and request is not None:
            self._metrics = RequestMetrics(
                request.arrival_time,
                request.first_scheduled_time,
                request.first_token_time,
                request.finish_time if self._finish is not None else None,
                request.token_times,
                max(request.num_cached_tokens, 0),
                self._num_preemptions,
            )
        return self._metrics

    @metrics.setter
    def metrics(self, value: RequestMetrics | None) -> None:
        self._metrics = value

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, prompt_token_ids={self.prompt_token_ids}, "
            f"outputs={self.outputs}, finished={self.finished}, new_token_ids={self.new_token_ids}, "
            f"metrics={self.metrics}, prompt={self.prompt!r})"
        )
