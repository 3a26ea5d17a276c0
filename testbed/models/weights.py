"""Weights into the model: from safetensors in a Hugging Face folder, or seeded random for shape-only configs."""

from pathlib import Path

import torch
from safetensors import safe_open

from testbed.models.llama import LlamaForCausalLM

# HF name fragment -> (our fused parameter fragment, shard index)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def _shard_bounds(model: LlamaForCausalLM, fused_name: str, shard: int) -> tuple[int, int]:
    arch = model.arch
    if "qkv_proj" in fused_name:
        q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
        sizes = [q, kv, kv]
    else:
        sizes = [arch.intermediate_size] * 2
    start = sum(sizes[:shard])
    return start, start + sizes[shard]


@torch.no_grad()
def load_hf_weights(model: LlamaForCausalLM, folder: Path) -> None:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    params = dict(model.named_parameters())
    loaded = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name == "lm_head.weight" and model.arch.tie_word_embeddings:
                    continue
                if "rotary_emb" in name:
                    continue
                target, bounds = name, None
                for frag, (fused, shard) in _FUSED.items():
                    if frag in name:
                        target = name.replace(frag, fused)
                        bounds = _shard_bounds(model, fused, shard)
                        break
                if target not in params:
                    raise ValueError(f"{file.name}: unexpected tensor {name!r} for this architecture")
                tensor = f.get_tensor(name)
                dest = params[target] if bounds is None else params[target][bounds[0] : bounds[1]]
                if dest.shape != tensor.shape:
                    raise ValueError(
                        f"{file.name}: {name} has shape {tuple(tensor.shape)}, model expects {tuple(dest.shape)}"
                    )
                dest.copy_(tensor)
                loaded.add((target, bounds))
    expected = set()
    for pname in params:
        fused = next((f for f, _ in _FUSED.values() if f in pname), None)
        if fused is None:
            expected.add((pname, None))
        else:
            shards = 3 if "qkv_proj" in fused else 2
            if pname.endswith(".bias"):
                shards = 3
            expected.update((pname, _shard_bounds(model, fused, s)) for s in range(shards))
    missing = sorted({name for name, _ in expected - loaded})
    if missing:
        raise ValueError(f"{folder}: weights missing for {missing[:5]}{' ...' if len(missing) > 5 else ''}")


@torch.no_grad()
def init_random_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Seeded, scaled so activations stay finite through many layers (for speed work, not quality)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            fan_in = param.shape[-1]
            param.copy_(torch.randn(param.shape, generator=gen, device=device) * (fan_in**-0.5) * 0.5)
