"""The step a worker receives: the SchedulerOutput reduced to plain data its input staging reads.

A worker stages its inputs with the same code as rank 0 (testbed.executor.inputs.stage_inputs), which reads of
each request its id, its speculative drafts and the tokens at the positions this step computes. So each request
travels as a `RequestView` carrying only that window of its tokens (a prompt is sent once per chunk, a decode
step sends one token), not the Request with its sampling state.
"""

from dataclasses import dataclass

from testbed.core.allocators.base import KVCopy
from testbed.core.sched_output import SchedulerOutput


@dataclass(slots=True)
class TokenWindow:
    """A request's tokens [offset, offset + len(tokens)) of `length` in all; indexing outside raises IndexError."""

    offset: int
    tokens: list[int]
    length: int

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self.length)
            if step != 1 or (stop > start and (start < self.offset or stop > self.offset + len(self.tokens))):
                raise IndexError(f"tokens [{start}, {stop}) are outside the window sent to this worker")
            return self.tokens[start - self.offset : stop - self.offset]
        i = i + self.length if i < 0 else i
        if not self.offset <= i < self.offset + len(self.tokens):
            raise IndexError(i)
        return self.tokens[i - self.offset]


@dataclass(slots=True)
class RequestView:
    request_id: str
    all_token_ids: TokenWindow
    spec_token_ids: list[int]


@dataclass(slots=True)
class WorkerStep:
    """The SchedulerOutput fields a worker reads, its requests as RequestViews (a StepToStage)."""

    requests: list[RequestView]
    num_new_tokens: list[int]
    num_computed_tokens: list[int]
    num_known_tokens: list[int]
    num_prefill_tokens: int
    num_decode_tokens: int
    finished_ids: list[str]
    block_updates: dict[str, tuple[int, list[int]]]
    kv_copies: list[KVCopy]

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.requests]


def worker_step(out: SchedulerOutput) -> WorkerStep:
    """`out` with each request replaced by the view of it that input staging reads."""
    views = []
    for r, start, k in zip(out.requests, out.num_computed_tokens, out.num_new_tokens):
        tokens = r.all_token_ids
        views.append(
            RequestView(
                r.request_id, TokenWindow(start, list(tokens[start : start + k]), len(tokens)), list(r.spec_token_ids)
            )
        )
    return WorkerStep(
        requests=views,
        num_new_tokens=list(out.num_new_tokens),
        num_computed_tokens=list(out.num_computed_tokens),
        num_known_tokens=list(out.num_known_tokens),
        num_prefill_tokens=out.num_prefill_tokens,
        num_decode_tokens=out.num_decode_tokens,
        finished_ids=list(out.finished_ids),
        block_updates=dict(out.block_updates),
        kv_copies=list(out.kv_copies),
    )
