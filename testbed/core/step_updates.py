"""StepUpdates: what Scheduler.update returns, the requests that got tokens (or failed) in a step and the
tokens each got, for the output processor (vLLM v1's EngineCoreOutputs, as two parallel lists).

In the common step every scheduled request gets exactly what the executor sampled for it, so the two
lists are the SchedulerOutput's requests and the executor's sampled lists themselves: update builds
nothing per request. They are copied before anything is added (append)."""

from testbed.request import Request


class StepUpdates:
    __slots__ = ("requests", "new_tokens", "_shared")

    def __init__(self, requests: list[Request], new_tokens: list[list[int]], shared: bool = False):
        self.requests = requests
        self.new_tokens = new_tokens  # aligned with requests: the tokens appended this step ([] if it failed)
        self._shared = shared  # the lists are the step's own (SchedulerOutput.requests, the sampled tokens)

    def __iter__(self):
        return zip(self.requests, self.new_tokens)

    def __len__(self) -> int:
        return len(self.requests)

    def append(self, request: Request, new_tokens: list[int]) -> None:
        if self._shared:
            self.requests, self.new_tokens, self._shared = list(self.requests), list(self.new_tokens), False
        self.requests.append(request)
        self.new_tokens.append(new_tokens)

    @classmethod
    def collect(
        cls,
        requests: list[Request],
        sampled: list[list[int] | None],
        changed: list[tuple[int, list[int] | None]],
        failed: list[tuple[Request, list[int]]],
    ) -> "StepUpdates":
        """Scheduler.update's pairs when some request did not get what was sampled for it (`changed`: batch
        index -> the tokens it got, None for none): the failed first, then the batch in order."""
        got = dict(changed)
        updates = cls([r for r, _ in failed], [t for _, t in failed])
        for idx, (request, tokens) in enumerate(zip(requests, sampled)):
            tokens = got.get(idx, tokens)
            if tokens is not None:
                updates.append(request, tokens)
        return updates
