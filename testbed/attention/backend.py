"""The kernel interface the model calls: attention over the paged KV cache plus the fused layer ops.

`KernelBackend` is the readable torch reference (`kernel=torch`); faster backends subclass it and
override what they accelerate, so a new backend is one small file plus one line in `_BACKENDS`.
"""

import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass

import torch

from testbed_kernels import reference

logger = logging.getLogger(__name__)


@dataclass
class AttentionMetadata:
    """Per-step layout of the flat token batch, shared by every layer."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token (-1 = padding)
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32: context length incl. this step's tokens
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class KernelBackend:
    """Torch reference backend: clear code for every op the model needs."""

    name = "torch"
    # Block sizes this backend can run; None = any.
    requires_power_of_two_block_size = False

    def attention(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Write this step's k/v into the cache, then attend causally over prefix + new tokens."""
        reference.write_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return self._decode(q, k_cache, v_cache, meta, scale)
        return reference.paged_attention_ref(
            q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, scale
        )

    def _decode(self, q, k_cache, v_cache, meta, scale):
        """Batched decode: gather every sequence's blocks at once and mask past each length."""
        num_seqs, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        max_blocks = (meta.max_seq_len + block_size - 1) // block_size
        tables = meta.block_tables[:, :max_blocks].long()
        k = k_cache[tables].reshape(num_seqs, max_blocks * block_size, num_kv_heads, head_dim)
        v = v_cache[tables].reshape(num_seqs, max_blocks * block_size, num_kv_heads, head_dim)
        group = num_heads // num_kv_heads
        qg = q.view(num_seqs, num_kv_heads, group, head_dim).float()
        scores = torch.einsum("skgd,stkd->skgt", qg, k.float()) * scale
        pos = torch.arange(max_blocks * block_size, device=q.device)
        mask = pos.unsqueeze(0) >= meta.seq_lens.unsqueeze(1)  # [s, t]
        scores.masked_fill_(mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("skgt,stkd->skgd", probs, v.float())
        return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)

    def linear(self, x, weight, bias=None):
        return torch.nn.functional.linear(x, weight, bias)

    def process_weights_after_loading(self, model) -> None:
        """Called once after the model's weights land on their device and dtype (vLLM's hook of the same
        name): a backend may derive what its kernels read from them here, not inside the first step."""

    def decode_layers(self, layers, positions, hidden, kv_caches, meta: AttentionMetadata, cos_sin):
        """A backend may run a step's decoder layers in one call, returning (hidden, residual) after the last
        one, bit-identical to running the layers; None (here) means: run them one by one."""
        return None

    def rms_norm(self, x, weight, eps, residual=None):
        return reference.rms_norm_ref(x, weight, eps, residual)

    def silu_and_mul(self, x):
        return reference.silu_and_mul_ref(x)

    def rotary(self, positions, q, k, cos_sin_cache):
        return reference.rotary_ref(positions, q, k, cos_sin_cache)


# name -> "module:Class"; imported lazily so `kernel=torch` never needs triton.
_BACKENDS = {
    "torch": "testbed.attention.backend:KernelBackend",
    "triton": "testbed.attention.triton_backend:TritonBackend",
    "cpu": "testbed.attention.cpu_backend:CpuBackend",
}


def resolve_kernel(name: str, device) -> str:
    """`auto` is the fastest backend that works on `device`: triton on CUDA; on a CPU the C++ kernels when
    they build here (a C++ compiler is present; the build is cached), else the torch reference. The
    environment variable TESTBED_KERNEL, when set, is what `auto` means (as VLLM_ATTENTION_BACKEND is for
    vLLM): the test suite sets it to the torch reference, whose results do not depend on the compute path."""
    if name != "auto":
        return name
    if os.environ.get("TESTBED_KERNEL"):
        return os.environ["TESTBED_KERNEL"]
    if torch.device(device).type == "cuda":
        return "triton" if importlib.util.find_spec("triton") is not None else "torch"
    try:
        from testbed_kernels.cpu import load

        load()  # compiles once (~20 s), then cached
        return "cpu"
    except (RuntimeError, ImportError, OSError) as e:
        logger.warning("kernel=auto: the C++ CPU kernels are unavailable (%s); using the torch reference", e)
        return "torch"


def get_backend(name: str) -> KernelBackend:
    if name not in _BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose one of {sorted(_BACKENDS)}")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
