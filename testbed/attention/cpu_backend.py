"""CPU backend (`kernel=cpu`): what makes the engine fast on a CPU without changing its results.

Decode rows go to a C++ paged-decode kernel that reads K/V straight through the block table (the torch
reference gathers every sequence's blocks into a padded copy first, which dominated decode time); in a
pure decode step the KV write and the attention are one call. Prefill chunks run torch's fused
scaled_dot_product_attention per sequence. Linear layers with few rows (decode steps, the LM head) use a
C++ kernel that streams each weight row once (kernels/cpu/linear.cpp); larger ones torch's GEMM.
RMSNorm (+residual) and rotary are fused C++ loops (one pass over memory where the reference makes
several); SiLU-mul stays torch's (its vectorised exp beats a plain C++ loop). The KV cache may be in a
narrower float dtype than the model (kv_cache_dtype): rows are widened to fp32 as they are read.
"""

import torch
import torch.nn.functional as F

import kernels.cpu as cpu_kernels
from kernels import reference
from testbed.attention.backend import AttentionMetadata, KernelBackend


class CpuBackend(KernelBackend):
    name = "cpu"

    def __init__(self):
        cpu_kernels.load()  # compile (or load the cached build) now, not inside the first step
        self._split_of, self._split_cache = None, None

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if meta.is_decode_only and q.shape[0] == meta.num_seqs:
            return cpu_kernels.decode_attention(
                q, k, v, k_cache, v_cache, meta.slot_mapping, meta.block_tables, meta.seq_lens, scale
            )
        cpu_kernels.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.attend_cached(q, k_cache, v_cache, meta, scale)

    def attend_cached(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Attention over K/V already in the cache (this step's tokens included)."""
        if meta.is_decode_only and q.shape[0] == meta.num_seqs:
            return cpu_kernels.paged_decode(q, k_cache, v_cache, meta.seq_lens, meta.block_tables, scale)
        out = torch.empty_like(q)
        rows, decode_lens, decode_tables, prefills = self._split(meta)
        if rows is not None:  # a mixed step: the decoding sequences still go through the kernel
            out[rows] = cpu_kernels.paged_decode(q[rows], k_cache, v_cache, decode_lens, decode_tables, scale)
        for i, q_lo, q_hi, ctx_len in prefills:
            out[q_lo:q_hi] = _prefill_one(q[q_lo:q_hi], k_cache, v_cache, meta.block_tables[i], ctx_len, scale)
        return out

    def _split(self, meta: AttentionMetadata):
        """Decode rows vs prefill chunks of a step, worked out once per step (every layer shares `meta`)."""
        if self._split_of is not meta:
            starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
            decode = [i for i in range(len(lens)) if starts[i + 1] - starts[i] == 1]
            idx = torch.tensor(decode, dtype=torch.long)
            self._split_cache = (
                torch.tensor([starts[i] for i in decode], dtype=torch.long) if decode else None,
                meta.seq_lens[idx],
                meta.block_tables[idx],
                [(i, starts[i], starts[i + 1], n) for i, n in enumerate(lens) if starts[i + 1] - starts[i] > 1],
            )
            self._split_of = meta
        return self._split_cache

    def linear(self, x, weight, bias=None):
        return cpu_kernels.linear(x, weight, bias)

    def rms_norm(self, x, weight, eps, residual=None):
        return cpu_kernels.rms_norm(x, weight, eps, residual)

    def rotary(self, positions, q, k, cos_sin_cache):
        return cpu_kernels.rotary(positions, q, k, cos_sin_cache)


def _prefill_one(q, k_cache, v_cache, block_table, ctx_len: int, scale: float) -> torch.Tensor:
    """Causal attention of one sequence's query chunk (the last q_len tokens of ctx_len) over its cache."""
    q_len = q.shape[0]
    # 4-D [1, heads, len, d] inputs: torch's CPU flash kernel (3-D ones fall back to the unfused math path)
    k = reference.gather_kv_ref(k_cache, block_table, ctx_len).to(q.dtype).transpose(0, 1)[None]
    v = reference.gather_kv_ref(v_cache, block_table, ctx_len).to(q.dtype).transpose(0, 1)[None]
    if q_len == ctx_len:
        mask, causal = None, True
    else:  # a chunk after a cached prefix: query i sees keys up to its position
        q_pos = torch.arange(ctx_len - q_len, ctx_len).unsqueeze(1)
        mask, causal = torch.arange(ctx_len).unsqueeze(0) <= q_pos, False
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
    )
    return out[0].transpose(0, 1)
