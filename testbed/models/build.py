"""Assemble a ready model: resolve the name, build the module, load or draw weights, move to device."""

import torch

from testbed.models.arch import ModelArch
from testbed.models.llama import LlamaForCausalLM
from testbed.models.registry import resolve_model
from testbed.models.weights import init_random_weights, load_hf_weights


def build_model(
    name: str, ops, dtype: torch.dtype, device: torch.device, seed: int = 0, max_model_len: int | None = None
):
    """Returns (model, arch, tokenizer or None, resolved name)."""
    resolved = resolve_model(name)
    arch = ModelArch.from_hf_config(resolved.hf_config)
    if max_model_len is not None and max_model_len > arch.max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={arch.max_position_embeddings}"
        )
    max_len = max_model_len or arch.max_position_embeddings
    with torch.device(device):
        model = LlamaForCausalLM(arch, ops, max_len)
    if resolved.weights_folder is None:
        init_random_weights(model, seed)
    else:
        load_hf_weights(model, resolved.weights_folder)
    model = model.to(dtype=dtype).eval()
    model.build_rope_cache()
    tokenizer = None
    if resolved.tokenizer_folder is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_folder)
    return model, arch, tokenizer, resolved.name
