"""One rank's shard of a Llama-family model, built and loaded alone (Megatron-LM's layout, as vLLM lays it out).

- Attention by heads: qkv_proj keeps this rank's query heads and KV heads (column parallel), o_proj its
  input columns (row parallel, all-reduce after); the KV cache holds this rank's KV heads.
- MLP: gate_up_proj keeps this rank's slice of the gate and of the up rows (column parallel), down_proj its
  input columns (row parallel, all-reduce after).
- Vocabulary parallel (Megatron's VocabParallelEmbedding / ParallelLMHead): each rank holds ceil(V / N) rows
  of the embedding and of the LM head (the last rank's padded with zeros). The embedding looks up the ids in
  its range, zeros elsewhere, and sums over ranks; the LM head's logits slices are gathered to rank 0, which
  samples. Tied embeddings stay tied: both hold the same rows.
- RMSNorm weights (and qwen3's per-head q/k norms) are replicated.

The rank's module is built on the meta device and each parameter is made at its shard's size and filled
from its pieces of the weights (testbed.models.weights: safetensors read by slice, seeded weights drawn in
chunks), so a rank never holds the whole model.
"""

import torch
from torch import nn

from testbed.models.arch import ModelArch
from testbed.models.build import ModelSpec, load_weights
from testbed.models.llama import DecoderLayer, LlamaForCausalLM, weight_of
from testbed.models.weights import Piece, Slices
from testbed.parallel.comm import TPGroup
from testbed.parallel.config import shard_arch


class RowParallelLinear(nn.Module):
    """A rank's input columns of a linear layer; the partial products summed over ranks (all-reduce)."""

    def __init__(self, weight: torch.Tensor, ops, group: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.ops, self.group = ops, group

    def forward(self, x):
        return self.group.all_reduce(self.ops.linear(x, self.weight, None))


class VocabParallelEmbedding(nn.Module):
    """A rank's rows [start, start + rows) of the embedding: ids outside them look up zeros, and the ranks'
    lookups are summed (every id is in exactly one rank's rows, so the sum is that row exactly)."""

    def __init__(self, weight: torch.Tensor, start: int, vocab_size: int, group: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.start, self.end = start, min(start + weight.shape[0], vocab_size)
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        out = nn.functional.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(out.masked_fill_(outside.unsqueeze(-1), 0.0))


class VocabParallelHead(nn.Module):
    """A rank's rows of the LM head's vocabulary. forward runs on rank 0 only: it tells the workers to score
    the same hidden rows (they call `local`), and gathers the slices into whole logits."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, ops, group: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.vocab_size, self.ops, self.group = vocab_size, ops, group

    def local(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """This rank's logits slice sent to rank 0; rank 0 gets the whole logits (None elsewhere)."""
        logits = self.group.gather_last_dim(self.ops.linear(hidden, self.weight, None))
        return None if logits is None else logits[..., : self.vocab_size]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.group.send(("logits", tuple(hidden.shape), str(hidden.dtype).removeprefix("torch.")))
        logits = self.local(self.group.broadcast(hidden.contiguous()))
        assert logits is not None  # rank 0
        return logits


def vocab_rows(vocab_size: int, n: int) -> int:
    """Embedding and LM head rows per rank (the last rank's padded)."""
    return -(-vocab_size // n)


def rank_slices(arch: ModelArch, rank: int, n: int) -> Slices:
    """Rank `rank`'s pieces of the whole model's parameters (the layout in the module docstring)."""
    d, full = arch.head_dim, arch.intermediate_size
    h, k, inter = arch.num_attention_heads // n, arch.num_key_value_heads // n, full // n
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    qkv = [Piece(0, rank * h * d, h * d, 0), Piece(0, q + rank * k * d, k * d, h * d)]
    qkv.append(Piece(0, q + kv + rank * k * d, k * d, (h + k) * d))
    gate_up = [Piece(0, rank * inter, inter, 0), Piece(0, full + rank * inter, inter, inter)]
    out: Slices = {}
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.qkv_proj.weight"] = qkv
        if arch.attention_bias:
            out[p + "self_attn.qkv_proj.bias"] = qkv
        out[p + "self_attn.o_proj.weight"] = [Piece(1, rank * h * d, h * d)]
        out[p + "mlp.gate_up_proj.weight"] = gate_up
        out[p + "mlp.down_proj.weight"] = [Piece(1, rank * inter, inter)]
    per = vocab_rows(arch.vocab_size, n)
    rows = [Piece(0, rank * per, max(0, min(per, arch.vocab_size - rank * per)))]
    out["model.embed_tokens.weight"] = rows
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = rows
    return out


@torch.no_grad()
def build_rank_model(
    spec: ModelSpec, ops, dtype: torch.dtype, device: torch.device, seed: int, group: TPGroup
) -> LlamaForCausalLM:
    """Rank group.rank's shard of the spec's model, with only its own weights loaded."""
    n, r, arch = group.world_size, group.rank, spec.arch
    hidden, per = arch.hidden_size, vocab_rows(arch.vocab_size, group.world_size)
    with torch.device("meta"):
        model = LlamaForCausalLM(shard_arch(arch, n), ops, spec.max_model_len)
        for layer in model.model.layers:
            if not isinstance(layer, DecoderLayer):  # LlamaModel's layers are
                raise TypeError(f"expected a DecoderLayer, got {type(layer).__name__}")
            layer.self_attn.o_proj = RowParallelLinear(weight_of(layer.self_attn.o_proj), ops, group)
            layer.mlp.down_proj = RowParallelLinear(weight_of(layer.mlp.down_proj), ops, group)
        embed = VocabParallelEmbedding(torch.empty(per, hidden), r * per, arch.vocab_size, group)
        head = VocabParallelHead(torch.empty(per, hidden), arch.vocab_size, ops, group)
        if arch.tie_word_embeddings:
            head.weight = embed.weight
        model.model.embed_tokens, model.lm_head = embed, head
    model.arch = arch  # the whole model's shape (its modules hold this rank's share)
    return load_weights(model, spec, ops, dtype, device, seed, rank_slices(arch, r, n))
