"""Split a built Llama-family model into one rank's shard, in place (Megatron-LM's layout, as vLLM lays it).

- Attention by heads: rank r keeps query heads [r*H/N, (r+1)*H/N) and KV heads [r*K/N, (r+1)*K/N) of the fused
  qkv projection (column parallel), the matching columns of o_proj (row parallel), and its KV cache holds only
  its KV heads.
- MLP: the gate and up halves of gate_up_proj split by columns, down_proj by rows.
- An all-reduce after o_proj and after down_proj (two per layer) restores the full hidden state on every rank.
- LM head: vocabulary parallel (each rank scores a contiguous slice of the vocabulary, padded to a multiple of N),
  the slices gathered into full logits; rank 0 drives it (`VocabParallelHead.forward`), the workers follow.
- The embedding stays whole on every rank (vLLM splits it by vocabulary too; here its memory is replicated).

Weights are loaded whole and then sliced (each rank builds the full model first): simple and exact, but a rank
briefly needs the whole model's memory (vLLM loads each rank's slices directly).
"""

import torch
from torch import nn

from testbed.models.llama import Attention, LlamaForCausalLM
from testbed.parallel.comm import TPGroup


class RowParallelLinear(nn.Module):
    """A rank's input columns of a linear layer; the partial products summed over ranks (all-reduce)."""

    def __init__(self, weight: torch.Tensor, ops, group: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.ops, self.group = ops, group

    def forward(self, x):
        return self.group.all_reduce(self.ops.linear(x, self.weight, None))


class VocabParallelHead(nn.Module):
    """A rank's slice of the LM head's vocabulary rows. forward runs on rank 0 only: it tells the workers to
    score the same rows (they call `local`), and gathers the slices."""

    def __init__(self, weight: torch.Tensor, vocab_size: int, ops, group: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.vocab_size, self.ops, self.group = vocab_size, ops, group

    def local(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last_dim(self.ops.linear(hidden, self.weight, None))[..., : self.vocab_size]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.group.send(("logits", tuple(hidden.shape), str(hidden.dtype).removeprefix("torch.")))
        return self.local(self.group.broadcast(hidden.contiguous()))


def _set(module: nn.Module, name: str, value: torch.Tensor) -> None:
    setattr(module, name, nn.Parameter(value, requires_grad=False))


def _rows(t: torch.Tensor, start: int, size: int) -> torch.Tensor:
    return t[start : start + size].clone()


@torch.no_grad()
def shard_model(model: LlamaForCausalLM, group: TPGroup) -> LlamaForCausalLM:
    """`model` (whole) reduced to rank group.rank's shard of group.world_size."""
    n, r = group.world_size, group.rank
    arch, ops = model.arch, model.ops
    d = arch.head_dim
    for layer in model.model.layers:
        attn: Attention = layer.self_attn
        h, k = attn.num_heads // n, attn.num_kv_heads // n
        q_size, kv_size = attn.q_size, attn.kv_size
        pieces = [(r * h * d, h * d), (q_size + r * k * d, k * d), (q_size + kv_size + r * k * d, k * d)]
        qkv = attn.qkv_proj
        _set(qkv, "weight", torch.cat([_rows(qkv.weight, s, z) for s, z in pieces]))
        if qkv.bias is not None:
            _set(qkv, "bias", torch.cat([_rows(qkv.bias, s, z) for s, z in pieces]))
        qkv.out_features = (h + 2 * k) * d
        attn.o_proj = RowParallelLinear(attn.o_proj.weight[:, r * h * d : (r + 1) * h * d].clone(), ops, group)
        attn.num_heads, attn.num_kv_heads, attn.q_size, attn.kv_size = h, k, h * d, k * d

        mlp, inter, full = layer.mlp, arch.intermediate_size // n, arch.intermediate_size
        gate_up = mlp.gate_up_proj
        _set(
            gate_up,
            "weight",
            torch.cat([_rows(gate_up.weight, r * inter, inter), _rows(gate_up.weight, full + r * inter, inter)]),
        )
        gate_up.out_features = 2 * inter
        mlp.down_proj = RowParallelLinear(mlp.down_proj.weight[:, r * inter : (r + 1) * inter].clone(), ops, group)

    vocab = arch.vocab_size
    per_rank = -(-vocab // n)
    head = model.lm_head.weight
    piece = head.new_zeros(per_rank, head.shape[1])
    rows = head[r * per_rank : min((r + 1) * per_rank, vocab)]
    piece[: rows.shape[0]] = rows
    model.lm_head = VocabParallelHead(piece, vocab, ops, group)
    return model
