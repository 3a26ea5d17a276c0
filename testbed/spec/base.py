"""The proposer interface: every method turns decode-ready requests into k drafts each.

A method is a registry name (testbed.spec.config.PROPOSERS) or the import path of the user's own Proposer
subclass (`spec.method=mylab.drafts:Mine`, its constructor's arguments in spec.options).
"""

from dataclasses import dataclass
from typing import Any

import torch

from testbed.request import Request


@dataclass(frozen=True)
class SpecContext:
    """What the engine hands a proposer class when it builds one (the model-based built-ins read it)."""

    target: Any  # the target model
    target_kv_caches: list  # its KV tensors, carrying num_scratch_blocks extra blocks for layerskip
    tables: Any  # the executor's block tables (a model proposer reads its requests' block ids there)
    sampler: Any
    backend: Any
    dtype: torch.dtype
    device: Any
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_model_len: int
    seed: int


class Proposer:
    """propose() gets requests whose tokens are all computed but the last (the one sampled last step)
    and how many drafts each may take; it returns (drafts, draft probabilities or None) per request.
    Probabilities [len(drafts), vocab] are q for rejection sampling; None means a deterministic
    proposal (q = one-hot), which is also what greedy requests need."""

    name = "base"
    writes_target_kv = False  # drafts into the target's KV tensors (which then carry num_scratch_blocks)

    @classmethod
    def build(cls, config, ctx: SpecContext) -> "Proposer":
        """A user's proposer gets only its options (spec.options); the built-ins read config and ctx."""
        return cls(**(config.options or {}))

    def observe(self, inputs) -> None:
        """Called after every target forward with its inputs (a draft model keeps its KV in step)."""

    def propose(self, requests: list[Request], num_tokens: list[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        raise NotImplementedError
