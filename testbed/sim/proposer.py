"""Drafts for simulated speculative decoding: k copies of the simulation's fixed token for every decoding
request (whether they are accepted is the simulated executor's draw)."""

from testbed.spec.base import Proposer


class FixedDraftProposer(Proposer):
    name = "simulated"

    def __init__(self, token_id: int):
        self.token_id = token_id

    def propose(self, requests, num_tokens):
        return [([self.token_id] * k, None) for k in num_tokens]
