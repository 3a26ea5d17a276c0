"""Speculative decoding as an interchangeable policy: `spec=none|ngram|draft|layerskip`.

A proposer drafts k tokens per decoding request (request.spec_token_ids); the scheduler gives the
request 1 + k tokens; the target scores them in one forward; verification keeps the longest
acceptable prefix plus one token of the target's; the scheduler rewinds the rejected tail's KV.
"""

from testbed.spec.config import METHODS, SpeculativeConfig
from testbed.spec.metrics import SpecMetrics
from testbed.spec.rejection import greedy_verify, rejection_sample
from testbed.spec.speculator import Speculator

__all__ = [
    "METHODS",
    "SpeculativeConfig",
    "SpecMetrics",
    "Speculator",
    "build_speculator",
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
    k = config.num_speculative_tokens
    arch = target.arch
    if config.method == "ngram":
        from testbed.spec.ngram import NgramProposer

        proposer = NgramProposer(config.prompt_lookup_max, config.prompt_lookup_min)
    elif config.method == "layerskip":
        from testbed.spec.draft import LayerSkipProposer

        total = arch.num_hidden_layers
        if not 1 <= config.num_layers < total:
            raise ValueError(
                f"layerskip num_layers must be in [1, {total - 1}] for a model of {total} layers, "
                f"got {config.num_layers}"
            )
        layers = config.num_layers
        proposer = LayerSkipProposer(
            target, layers, target_kv_caches[:layers], tables, sampler, num_blocks, block_size, max_num_seqs, k, device
        )
    else:
        from testbed.executor.kv_cache import allocate_kv_cache
        from testbed.models.build import build_model, load_model_spec
        from testbed.spec.draft import DraftModelProposer, num_scratch_blocks

        spec = load_model_spec(config.model, max_model_len)
        if spec.arch.vocab_size != arch.vocab_size:
            raise ValueError(
                f"draft model {config.model!r} has vocab_size {spec.arch.vocab_size}, the target has "
                f"{arch.vocab_size}: they must share the tokenizer"
            )
        layers = spec.arch.num_hidden_layers if config.num_layers is None else config.num_layers
        if not 1 <= layers <= spec.arch.num_hidden_layers:
            raise ValueError(f"draft num_layers must be in [1, {spec.arch.num_hidden_layers}], got {layers}")
        model = build_model(spec, backend, dtype, device, seed)
        if layers < spec.arch.num_hidden_layers:  # drop the unused layers' weights
            del model.model.layers[layers:]
        scratch = num_scratch_blocks(k, block_size, max_num_seqs)
        kv_caches = allocate_kv_cache(spec.arch, num_blocks + scratch, block_size, layers, dtype, device)
        proposer = DraftModelProposer(
            model, layers, kv_caches, tables, sampler, num_blocks, block_size, max_num_seqs, k, device
        )
    return Speculator(config, proposer, max_model_len)
