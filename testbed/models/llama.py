"""Llama-family decoder (llama, mistral, qwen2, qwen3) over a flat batch of tokens.

Every op with a kernel goes through `ops` (a KernelBackend), linear layers included, so `kernel=torch|triton|cpu`
swaps them all; a backend may also run a decode step's layers in one call (`ops.decode_layers`, kernel=cpu).
Module names follow Hugging Face's, except the fused qkv_proj and gate_up_proj (see weights.py).
"""

import torch
from torch import nn

from testbed.attention.backend import AttentionMetadata, KernelBackend
from testbed.models.arch import ModelArch
from testbed.models.rope import cos_sin_cache


def weight_of(module: nn.Module) -> nn.Parameter:
    """A layer's weight (Linear, Embedding, or a tensor-parallel rank's own layer in their place)."""
    weight = module.weight
    if not isinstance(weight, nn.Parameter):
        raise TypeError(f"{type(module).__name__}.weight is not a parameter")
    return weight


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) whose matmul goes through the kernel backend."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ops: KernelBackend):
        super().__init__(in_features, out_features, bias=bias)
        self.ops = ops

    def forward(self, x):
        return self.ops.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, ops: KernelBackend):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps, self.ops = eps, ops

    def forward(self, x, residual=None):
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, arch: ModelArch, ops: KernelBackend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads,
            arch.num_key_value_heads,
            arch.head_dim,
        )
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(arch.hidden_size, self.q_size + 2 * self.kv_size, arch.attention_bias, ops)
        # nn.Module: a tensor-parallel rank swaps in its own (testbed.parallel.sharding), as for down_proj,
        # embed_tokens and lm_head
        self.o_proj: nn.Module = Linear(self.q_size, arch.hidden_size, False, ops)
        self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, ops) if arch.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, ops) if arch.qk_norm else None
        self.scale = self.head_dim**-0.5
        self.ops = ops

    def forward(self, positions, hidden, kv_cache, meta: AttentionMetadata, cos_sin):
        n = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)
        v = v.reshape(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (arch.qk_norm)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rotary(positions, q, k, cos_sin)
        out = self.ops.attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, arch: ModelArch, ops: KernelBackend):
        super().__init__()
        self.gate_up_proj = Linear(arch.hidden_size, 2 * arch.intermediate_size, False, ops)
        self.down_proj: nn.Module = Linear(arch.intermediate_size, arch.hidden_size, False, ops)
        self.ops = ops

    def forward(self, x):
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, ops: KernelBackend):
        super().__init__()
        self.self_attn = Attention(arch, ops)
        self.mlp = MLP(arch, ops)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, ops)

    def forward(self, positions, hidden, residual, kv_cache, meta, cos_sin):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta, cos_sin)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, arch: ModelArch, ops: KernelBackend):
        super().__init__()
        # _weight: no random init (the loader fills it; normal_ on the meta device would import torch._dynamo)
        self.embed_tokens: nn.Module = nn.Embedding(
            arch.vocab_size, arch.hidden_size, _weight=torch.empty(arch.vocab_size, arch.hidden_size)
        )
        self.layers = nn.ModuleList(DecoderLayer(arch, ops) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, ops)


class LlamaForCausalLM(nn.Module):
    def __init__(self, arch: ModelArch, ops: KernelBackend, max_positions: int):
        super().__init__()
        self.arch = arch
        self.ops = ops
        self.model = LlamaModel(arch, ops)
        self.lm_head: nn.Module = Linear(arch.hidden_size, arch.vocab_size, False, ops)
        if arch.tie_word_embeddings:
            self.lm_head.weight = weight_of(self.model.embed_tokens)
        self.max_positions = max_positions
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build_rope_cache(self):
        """Called once after the weights land on their device and dtype."""
        weight = weight_of(self.model.embed_tokens)
        self.cos_sin = cos_sin_cache(
            self.arch.head_dim,
            self.max_positions,
            self.arch.rope_theta,
            self.arch.rope_scaling,
            weight.dtype,
            weight.device,
        )

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, num_layers: int | None = None):
        """Hidden states after the final norm; `num_layers` runs only the first L layers (self-speculation)."""
        hidden, residual = self.model.embed_tokens(input_ids), None
        # (slicing an nn.ModuleList builds a new one, a cost per step: only for self-speculation)
        layers = self.model.layers if num_layers is None else self.model.layers[:num_layers]
        fused = self.ops.decode_layers(layers, positions, hidden, kv_caches, meta, self.cos_sin)
        if fused is not None:  # the backend ran the layers in one call (kernel=cpu decode steps)
            hidden, residual = fused
        else:
            for layer, kv_cache in zip(layers, kv_caches):
                hidden, residual = layer(positions, hidden, residual, kv_cache, meta, self.cos_sin)
        hidden, _ = self.model.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden):
        return self.lm_head(hidden).float()
