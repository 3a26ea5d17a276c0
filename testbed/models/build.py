"""Resolve a model name into its spec (shape, tokenizer), then build the module with its weights.

The two are separate so that parts needing only the shape (KV sizing, the null and simulated executors)
never build weights.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from testbed.models.arch import ModelArch
from testbed.models.llama import LlamaForCausalLM
from testbed.models.registry import resolve_model
from testbed.models.weights import Slices, draw_random_weights, load_hf_weights

if TYPE_CHECKING:
    from testbed.config import ModelConfig


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


def load_model_spec_from(model: "ModelConfig") -> ModelSpec:
    """The spec of an engine's model group: its name with its hf_config values, tokenizer and context."""
    return load_model_spec(model.name, model.max_model_len, model.tokenizer, model.hf_config)


def build_model(spec: ModelSpec, ops, dtype: torch.dtype, device: torch.device, seed: int = 0) -> LlamaForCausalLM:
    """The module on `device` in `dtype`, with the spec's weights (or seeded random ones)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(spec.arch, ops, spec.max_model_len)
    return load_weights(model, spec, ops, dtype, device, seed, {})


def whole_parameters(arch: ModelArch, ops) -> dict[str, torch.Size]:
    """The whole model's parameter shapes by name, in its order (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(arch, ops, 1)
    return {name: p.shape for name, p in model.named_parameters()}


@torch.no_grad()
def load_weights(
    model: LlamaForCausalLM, spec: ModelSpec, ops, dtype: torch.dtype, device: torch.device, seed: int, slices: Slices
) -> LlamaForCausalLM:
    """`model`, built on the meta device, made real on `device` in `dtype` with its pieces (`slices`, empty:
    the whole) of the spec's weights or seeded random ones; only its own parameters are ever allocated."""
    made: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # id(meta parameter) -> (it, the real one)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if id(p) not in made:  # a tied parameter is made once
                made[id(p)] = p, nn.Parameter(torch.empty(p.shape, dtype=dtype, device=device), requires_grad=False)
            setattr(module, name, made[id(p)][1])
    params = dict(model.named_parameters())
    for name, p in params.items():
        if name in slices:  # padding rows no piece covers (a vocabulary split unevenly) stay zero
            p.zero_()
    model.cos_sin = torch.empty(0, device=device)
    whole = whole_parameters(spec.arch, ops)
    if spec.weights_folder is None:
        draw_random_weights(params, whole, slices, seed, device)
    else:
        load_hf_weights(params, spec.arch, whole, slices, spec.weights_folder)
    model.eval()
    model.build_rope_cache()
    ops.process_weights_after_loading(model)
    return model
