"""Resolve a model name into its spec (shape, tokenizer), then build the module with its weights.

The two are separate so that parts needing only the shape (KV sizing, the null and simulated executors)
never build weights.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from testbed.models.arch import ModelArch
from testbed.models.llama import LlamaForCausalLM
from testbed.models.registry import resolve_model
from testbed.models.weights import init_random_weights, load_hf_weights


@dataclass
class ModelSpec:
    name: str  # the resolved name
    arch: ModelArch
    max_model_len: int  # the engine's context: max_model_len if given, else the model's
    tokenizer: Any  # a transformers tokenizer, or None (shape-only models)
    weights_folder: Path | None  # None: seeded random weights

    @property
    def eos_token_ids(self) -> list[int]:
        ids = list(self.arch.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return ids


def load_model_spec(
    name: str, max_model_len: int | None = None, tokenizer: str | None = None, hf_config: dict | None = None
) -> ModelSpec:
    """tokenizer: take the tokenizer of this model name or folder instead (vLLM's --tokenizer); hf_config:
    values over the model's own config (testbed.models.registry)."""
    resolved = resolve_model(name, hf_config)
    arch = ModelArch.from_hf_config(resolved.hf_config)
    if max_model_len is not None and max_model_len > arch.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={arch.max_position_embeddings}"
        )
    folder = resolved.tokenizer_folder if tokenizer is None else resolve_model(tokenizer).tokenizer_folder
    if tokenizer is not None and folder is None:
        raise ValueError(f"tokenizer={tokenizer!r} names a model without a tokenizer")
    tok = None
    if folder is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(folder)
    return ModelSpec(resolved.name, arch, max_model_len or arch.max_position_embeddings, tok, resolved.weights_folder)


def build_model(spec: ModelSpec, ops, dtype: torch.dtype, device: torch.device, seed: int = 0) -> LlamaForCausalLM:
    """The module on `device` in `dtype`, with the spec's weights (or seeded random ones)."""
    with torch.device(device):
        model = LlamaForCausalLM(spec.arch, ops, spec.max_model_len)
    if spec.weights_folder is None:
        init_random_weights(model, seed)
    else:
        load_hf_weights(model, spec.weights_folder)
    model = model.to(dtype=dtype).eval()
    model.build_rope_cache()
    ops.process_weights_after_loading(model)
    return model
