"""Counters of speculative decoding, summed over the engine's life.

Definitions follow vLLM v1 (vllm/v1/spec_decode/metrics.py): a *verification* (vLLM: a "draft") is one
request scheduled with >= 1 draft token; acceptance rate = accepted / drafted tokens; mean acceptance
length = (accepted + verifications) / verifications; per-position acceptance rate at position j =
verifications whose draft j was accepted / all verifications (unconditional: it falls with j because a
draft is only accepted after every earlier one was). We add the conditional rate, accepted at j / drafted
at j ("given a draft reached position j, how often it was right"), NaN where nothing was drafted.
"""

import math
from dataclasses import dataclass, field


@dataclass
class SpecMetrics:
    method: str
    num_speculative_tokens: int
    num_proposed_tokens: int = 0  # drafts handed to requests by the proposer
    num_drafts: int = 0  # verifications (a request scheduled with >= 1 draft)
    num_draft_tokens: int = 0  # drafts verified (the token budget may schedule fewer than proposed)
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0  # accepted + the target's own token, over verifications
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    propose_time_s: float = 0.0  # drafting, incl. the draft model's KV upkeep

    def __post_init__(self):
        self.drafted_per_position = [0] * self.num_speculative_tokens
        self.accepted_per_position = [0] * self.num_speculative_tokens

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.num_emitted_tokens += num_accepted + 1
        for j in range(num_drafts):
            self.drafted_per_position[j] += 1
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification (accepted drafts + 1), vLLM's 'mean acceptance length'."""
        return self.num_emitted_tokens / self.num_drafts if self.num_drafts else 0.0

    def per_position_acceptance_rate(self) -> list[float]:
        """vLLM's per-position acceptance rate: accepted at position j / verifications; NaN at positions
        never drafted (and everywhere before the first verification)."""
        n = self.num_drafts
        return [a / n if n and d else math.nan for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "proposed": self.num_proposed_tokens,
            "verifications": self.num_drafts,
            "drafted": self.num_draft_tokens,
            "accepted": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_accepted_drafts": self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0,
            "per_position_acceptance_rate": self.per_position_acceptance_rate(),
            "per_position_conditional_acceptance": [
                a / d if d else math.nan for a, d in zip(self.accepted_per_position, self.drafted_per_position)
            ],
            "drafted_per_position": list(self.drafted_per_position),
            "accepted_per_position": list(self.accepted_per_position),
            "propose_time_s": self.propose_time_s,
        }
