"""CPU backend (`kernel=cpu`): what makes the engine fast on a CPU without changing its results.

Decode rows go to a C++ paged-decode kernel that reads K/V straight through the block table (the torch
reference gathers every sequence's blocks into a padded copy first, which dominated decode time); in a
pure decode step the KV write and the attention are one call. Prefill chunks (a fresh prompt, or a chunk
after a cached prefix) go to a C++ flash-attention kernel over the same block table, all of a step's chunks
in one call (testbed_kernels/cpu/paged_prefill.cpp). Linear layers with few rows (decode steps, the LM head) use a
C++ kernel over a packed copy of the weights, made when the weights are loaded, that streams them once
(testbed_kernels/cpu/linear.cpp); larger ones torch's GEMM. The packed copies double the float32 weights' memory;
TESTBED_CPU_PACKED_WEIGHTS=0 in the environment keeps none (then every linear layer is torch's GEMM).
RMSNorm (+residual), rotary and SiLU-and-mul are fused C++ loops (one pass over memory where the reference
makes several). The KV cache may be in a narrower float dtype than the model (kv_cache_dtype): rows are
widened to fp32 as they are read.
"""

import os
import weakref

import torch

import testbed_kernels.cpu as cpu_kernels
from testbed.attention.backend import AttentionMetadata, KernelBackend


class CpuBackend(KernelBackend):
    name = "cpu"

    def __init__(self):
        # compile (or load the cached build) now, not inside the first step; the one-off time is reported
        self.build_seconds = cpu_kernels.load()
        self._split_of, self._split_cache = None, None
        self._layer_weights = {}  # (first layer's id, number of layers) -> decode_layers' weight list
        self.packed_weights = os.environ.get("TESTBED_CPU_PACKED_WEIGHTS", "1") != "0"
        self._packed = {}  # id(weight) -> (weak reference to the weight, its packed copy)

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
        rows, decode_lens, decode_tables, chunks = self._split(meta)
        if rows is not None:  # a mixed step: the decoding sequences still go through the decode kernel
            out[rows] = cpu_kernels.paged_decode(q[rows], k_cache, v_cache, decode_lens, decode_tables, scale)
        if len(chunks):
            cpu_kernels.paged_prefill(q, k_cache, v_cache, meta.block_tables, chunks, scale, out=out)
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
                torch.tensor(
                    [
                        (i, starts[i], starts[i + 1] - starts[i], n)
                        for i, n in enumerate(lens)
                        if starts[i + 1] - starts[i] > 1
                    ],
                    dtype=torch.int64,
                ).view(-1, 4),
            )
            self._split_of = meta
        return self._split_cache

    def linear(self, x, weight, bias=None):
        return cpu_kernels.linear(x, weight, bias, self.packed(weight))

    def process_weights_after_loading(self, model) -> None:
        """Pack every float32 linear weight now, so that no step pays for it."""
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                self.packed(module.weight)

    def packed(self, weight):
        """weight in linear.cpp's panel layout (float32 only, else None), packed once and kept while the
        weight lives; the weights are taken as fixed once the model runs."""
        if not self.packed_weights or weight.dtype != torch.float32:
            return None
        entry = self._packed.get(id(weight))
        if entry is None or entry[0]() is not weight:
            with torch.no_grad():
                copy = cpu_kernels.pack_linear(weight)
            key = id(weight)

            def forget(_ref: weakref.ref) -> None:  # the weight is gone: so is its packed copy
                self._packed.pop(key, None)

            entry = (weakref.ref(weight, forget), copy)
            self._packed[key] = entry
        return entry[1]

    def decode_layers(self, layers, positions, hidden, kv_caches, meta: AttentionMetadata, cos_sin):
        """Pure decode steps: every layer in one C++ call, the same kernels in the same order as the layers'
        own forward (testbed_kernels/cpu/decode_layers.cpp), without a Python round trip per op."""
        if not (meta.is_decode_only and hidden.shape[0] == meta.num_seqs and len(layers)):
            return None
        attn = layers[0].self_attn
        key = (id(layers[0]), len(layers))
        if key not in self._layer_weights:
            self._layer_weights[key] = [w for layer in layers for w in _layer_weights(layer, self.packed)]
        few_rows = cpu_kernels.FEW_ROWS if hidden.dtype == torch.float32 else -1  # as linear(): fp32 only
        eps = layers[0].input_layernorm.eps
        return cpu_kernels.decode_layers(
            hidden,
            positions,
            (meta.slot_mapping, meta.block_tables, meta.seq_lens),
            cos_sin,
            self._layer_weights[key],
            [t for kv in kv_caches[: len(layers)] for t in kv],
            (attn.num_heads, attn.num_kv_heads, attn.head_dim, eps, attn.scale),
            few_rows,
        )

    def rms_norm(self, x, weight, eps, residual=None):
        return cpu_kernels.rms_norm(x, weight, eps, residual)

    def silu_and_mul(self, x):
        return cpu_kernels.silu_and_mul(x)

    def rotary(self, positions, q, k, cos_sin_cache):
        return cpu_kernels.rotary(positions, q, k, cos_sin_cache)


def _layer_weights(layer, packed) -> list:
    """One decoder layer's tensors in decode_layers.cpp's order (None where the architecture has none), its
    four linear weights' packed copies (`packed(weight)`, None where not packed) last."""
    attn, mlp = layer.self_attn, layer.mlp
    norms = (attn.q_norm.weight, attn.k_norm.weight) if attn.q_norm is not None else (None, None)
    eps = {layer.input_layernorm.eps, layer.post_attention_layernorm.eps}
    if attn.q_norm is not None:
        eps |= {attn.q_norm.eps, attn.k_norm.eps}
    assert len(eps) == 1, "decode_layers takes one RMSNorm epsilon for every norm of the model"
    linears = (attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight)
    return [
        layer.input_layernorm.weight,
        attn.qkv_proj.weight,
        attn.qkv_proj.bias,
        *norms,
        attn.o_proj.weight,
        layer.post_attention_layernorm.weight,
        mlp.gate_up_proj.weight,
        mlp.down_proj.weight,
        *(packed(w) for w in linears),
    ]
