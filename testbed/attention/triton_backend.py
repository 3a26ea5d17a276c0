"""Triton backend (`kernel=triton`): the kernels in testbed_kernels/triton_*.py behind the KernelBackend interface.

On CPU the kernels only run under TRITON_INTERPRET=1 (slow; for tests).
"""

import torch

from testbed.attention.backend import AttentionMetadata, KernelBackend
from testbed_kernels.triton_kv_write import write_kv
from testbed_kernels.triton_paged_decode import paged_decode
from testbed_kernels.triton_paged_prefill import paged_prefill
from testbed_kernels.triton_rms_norm import rms_norm
from testbed_kernels.triton_rotary import rotary
from testbed_kernels.triton_silu_mul import silu_and_mul


class TritonBackend(KernelBackend):
    name = "triton"
    # page lookups use shifts/masks; the KV tile is independent of the block size
    requires_power_of_two_block_size = True

    def __init__(self, num_splits: int | None = None):
        self.num_splits = num_splits  # None = pick split-KV by context length

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        # decode kernel maps query row i to sequence i; otherwise the prefill kernel handles it
        if meta.is_decode_only and q.shape[0] == meta.num_seqs:
            return paged_decode(
                q,
                k_cache,
                v_cache,
                meta.seq_lens,
                meta.block_tables,
                scale,
                max_seq_len=meta.max_seq_len,
                num_splits=self.num_splits,
            )
        return paged_prefill(
            q,
            k_cache,
            v_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            scale,
            max_query_len=meta.max_query_len,
        )

    def rms_norm(self, x, weight, eps, residual=None):
        return rms_norm(x, weight, eps, residual)

    def silu_and_mul(self, x):
        return silu_and_mul(x)

    def rotary(self, positions, q, k, cos_sin_cache):
        return rotary(positions, q, k, cos_sin_cache)
