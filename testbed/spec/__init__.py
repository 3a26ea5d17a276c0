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


def build_speculator(value, engine) -> Speculator | None:
    """The engine's speculator for a speculative_config (dict or SpeculativeConfig), None for 'none'.
    Needs engine.model, .arch, .backend, .dtype, .device, .kv, .max_model_len, .config."""
    config = SpeculativeConfig.from_any(value)
    if not config.enabled:
        return None
    k = config.num_speculative_tokens
    ec = engine.config
    if config.method == "ngram":
        from testbed.spec.ngram import NgramProposer

        proposer = NgramProposer(config.prompt_lookup_max, config.prompt_lookup_min)
    elif config.method == "layerskip":
        from testbed.spec.draft import LayerSkipProposer

        total = engine.arch.num_hidden_layers
        if not 1 <= config.num_layers < total:
            raise ValueError(
                f"layerskip num_layers must be in [1, {total - 1}] for {engine.model_name} "
                f"({total} layers), got {config.num_layers}"
            )
        proposer = LayerSkipProposer(
            engine.model, config.num_layers, engine.kv.num_blocks, ec.block_size, ec.max_num_seqs, k, engine.device
        )
    else:
        from testbed.models.build import build_model
        from testbed.spec.draft import DraftModelProposer

        model, arch, _, _ = build_model(
            config.model, engine.backend, engine.dtype, engine.device, ec.seed, engine.max_model_len
        )
        if arch.vocab_size != engine.arch.vocab_size:
            raise ValueError(
                f"draft model {config.model!r} has vocab_size {arch.vocab_size}, the target "
                f"{engine.model_name!r} has {engine.arch.vocab_size}: they must share the tokenizer"
            )
        layers = arch.num_hidden_layers if config.num_layers is None else config.num_layers
        if not 1 <= layers <= arch.num_hidden_layers:
            raise ValueError(f"draft num_layers must be in [1, {arch.num_hidden_layers}], got {layers}")
        if layers < arch.num_hidden_layers:  # drop the unused layers' weights
            del model.model.layers[layers:]
        proposer = DraftModelProposer(
            model, layers, engine.kv.num_blocks, ec.block_size, ec.max_num_seqs, k, engine.device, engine.dtype
        )
    return Speculator(config, proposer, engine.max_model_len)
