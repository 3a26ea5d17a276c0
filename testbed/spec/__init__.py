"""Speculative decoding as an interchangeable policy: `spec=none|ngram|draft|layerskip` (or module:Class).

A proposer drafts k tokens per decoding request (request.spec_token_ids); the scheduler gives the
request 1 + k tokens; the target scores them in one forward; verification keeps the longest
acceptable prefix plus one token of the target's; the scheduler rewinds the rejected tail's KV.
"""

from testbed.spec.base import Proposer, SpecContext
from testbed.spec.config import METHODS, PROPOSERS, SpeculativeConfig, proposer_class
from testbed.spec.metrics import SpecMetrics
from testbed.spec.rejection import greedy_verify, rejection_sample
from testbed.spec.speculator import Speculator

__all__ = [
    "METHODS",
    "PROPOSERS",
    "Proposer",
    "SpecContext",
    "SpeculativeConfig",
    "SpecMetrics",
    "Speculator",
    "build_speculator",
    "proposer_class",
    "greedy_verify",
    "rejection_sample",
]


def build_speculator(
    config: SpeculativeConfig,
    *,
    target,
    target_kv_caches: list,
    tables,
    sampler,
    backend,
    dtype,
    device,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_model_len: int,
    seed: int,
) -> Speculator | None:
    """The speculator for an enabled config (None for method 'none'). `target` is the target model;
    `target_kv_caches` its KV tensors, which carry `num_scratch_blocks` extra blocks for layerskip;
    `tables` the executor's block tables (a model proposer reads its requests' block ids there)."""
    if not config.enabled:
        return None
    context = SpecContext(
        target,
        target_kv_caches,
        tables,
        sampler,
        backend,
        dtype,
        device,
        num_blocks,
        block_size,
        max_num_seqs,
        max_model_len,
        seed,
    )
    return Speculator(config, proposer_class(config.method).build(config, context), max_model_len)
