"""The proposer interface: every method turns decode-ready requests into k drafts each."""

import torch

from testbed.request import Request


class Proposer:
    """propose() gets requests whose tokens are all computed but the last (the one sampled last step)
    and how many drafts each may take; it returns (drafts, draft probabilities or None) per request.
    Probabilities [len(drafts), vocab] are q for rejection sampling; None means a deterministic
    proposal (q = one-hot), which is also what greedy requests need."""

    name = "base"

    def observe(self, inputs) -> None:
        """Called after every target forward with its inputs (a draft model keeps its KV in step)."""

    def propose(self, requests: list[Request], num_tokens: list[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        raise NotImplementedError
