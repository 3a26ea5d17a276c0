"""Torch references for the paged-attention kernels: readable, exact, any block size.

The engine's `kernel=torch` backend runs these; the Triton kernels are tested against them.
"""

import torch


def write_kv_ref(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter new keys/values [num_tokens, num_kv_heads, head_dim] into their cache slots.

    A slot of -1 means "do not write" (padding tokens).
    """
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    # index_copy_ on the flat [slots, heads, dim] view: far faster than advanced-index assignment
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key[valid].to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value[valid].to(v_cache.dtype))


def gather_kv_ref(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached token states of one sequence: [length, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [nb, bs, kvh, d]
    return blocks.reshape(-1, *cache.shape[2:])[:length]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of variable-length query chunks over their paged KV (prefix + chunk).

    q: [num_tokens, num_heads, head_dim], tokens of sequence i are
       q[query_start_loc[i]:query_start_loc[i+1]] and are the *last* tokens of its context.
    seq_lens[i]: context length of sequence i including those query tokens (already written to the cache).
    block_tables: [num_seqs, max_blocks] int. Returns [num_tokens, num_heads, head_dim] in q's dtype.
    Decode is the special case of one query token per sequence.
    """
    num_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, ctx_len in enumerate(lens):
        q_lo, q_hi = starts[i], starts[i + 1]
        q_len = q_hi - q_lo
        if q_len == 0:
            continue
        k = gather_kv_ref(k_cache, block_tables[i], ctx_len).float()
        v = gather_kv_ref(v_cache, block_tables[i], ctx_len).float()
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, d]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qi = q[q_lo:q_hi].float().transpose(0, 1)  # [H, q_len, d]
        scores = torch.matmul(qi, k.transpose(1, 2)) * scale  # [H, q_len, ctx]
        q_pos = torch.arange(ctx_len - q_len, ctx_len).unsqueeze(1)
        kv_pos = torch.arange(ctx_len).unsqueeze(0)
        scores.masked_fill_(kv_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_lo:q_hi] = torch.matmul(probs, v).transpose(0, 1).to(q.dtype)
    return out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm in fp32; with a residual, returns (normed(x + residual), x + residual)."""
    if residual is not None:
        x = x + residual
        residual = x
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return normed if residual is None else (normed, residual)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x = [..., 2*d] (gate | up) -> silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rotary_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Neox-style rotary embedding. q/k: [num_tokens, heads, head_dim]; cos_sin_cache: [max_pos, head_dim]
    holding cos in the first half and sin in the second. Returns rotated (q, k)."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)
