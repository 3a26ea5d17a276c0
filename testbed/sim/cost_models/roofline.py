"""Analytic step time from a device description and the model's shape (the roofline model, Williams et
al., CACM 2009, applied per kernel class as LLM-serving simulators do, e.g. Vidur's and LLMCompass's
analytic modes).

Each class of work runs at the slower of its compute and memory time, at achievable (not peak) rates:
  linear layers   2 * params * rows (+ the LM head for logits rows) FLOPs | every weight read once
  prefill attn    4 * heads * head_dim * layers * causal query-key pairs   | the chunk's context KV read
  decode attn     4 * heads * head_dim * layers * KV tokens read           | those KV bytes
plus the new tokens' KV written, a per-step and a per-sequence overhead. The classes are summed (they
run one after another). Tensor parallelism is priced around it (a rank's shape plus collectives:
testbed/parallel/sim_cost.py). Not modelled: kernel launch gaps beyond the overheads,
activation traffic, sampling cost, and the host work of scheduling (assumed hidden).
"""

import numpy as np

from testbed.sim.cost_models.base import CostContext, CostModel
from testbed.sim.devices import DeviceSpec
from testbed.sim.shape import StepShape

# up to this many steps a decode run's prices are made in Python, skipping numpy's fixed cost per call: most
# planned runs' first blocks are shorter (they end at the next arrival)
_FEW_STEPS = 24


class RooflineCost(CostModel):
    name = "roofline"
    kv_capacity = "device"
    tensor_parallel: str | None = "rank"

    @classmethod
    def build(cls, ctx: CostContext) -> "RooflineCost":  # type: ignore[override]
        if ctx.device is None:
            raise ValueError("the roofline cost model needs a device with a spec sheet (device=h100-sxm, ...)")
        return cls(ctx.arch, ctx.dtype.itemsize, ctx.device)

    def __init__(self, arch, dtype_bytes: int, device: DeviceSpec):
        self.device = device
        h, layers = arch.hidden_size, arch.num_hidden_layers
        q_out = arch.num_attention_heads * arch.head_dim
        kv_out = arch.num_key_value_heads * arch.head_dim
        per_layer = h * (q_out + 2 * kv_out) + q_out * h + 3 * h * arch.intermediate_size
        self.linear_params = layers * per_layer
        self.head_params = h * arch.vocab_size
        self.weight_bytes = (self.linear_params + self.head_params) * dtype_bytes
        self.attn_flops_per_pair = 4 * arch.num_attention_heads * arch.head_dim * layers
        self.kv_bytes_per_token = arch.kv_bytes_per_token(dtype_bytes)

    @property
    def identity(self) -> dict:
        d = self.device
        return {
            "cost_model": self.name,
            "device": d.name,
            "efficiency": dict(d.efficiency),
            "step_overhead_us": d.step_overhead_us,
            "seq_overhead_us": d.seq_overhead_us,
        }

    def step_time(self, s: StepShape) -> float:
        flops, bw = self.device.flops, self.device.bandwidth
        linear = max(
            (2 * self.linear_params * s.num_tokens + 2 * self.head_params * s.num_logits) / flops,
            self.weight_bytes / bw,
        )
        prefill = (
            max(self.attn_flops_per_pair * s.prefill_pairs / flops, self.kv_bytes_per_token * s.prefill_context / bw)
            if s.prefill_seqs
            else 0.0
        )
        decode = (
            max(self.attn_flops_per_pair * s.decode_context / flops, self.kv_bytes_per_token * s.decode_context / bw)
            if s.decode_seqs
            else 0.0
        )
        kv_write = self.kv_bytes_per_token * s.num_tokens / bw
        overhead = 1e-6 * (self.device.step_overhead_us + self.device.seq_overhead_us * s.num_seqs)
        return linear + prefill + decode + kv_write + overhead

    def decode_step_times(self, num_seqs: int, first_context: int, count: int) -> list[float]:
        """step_time of a decode run's steps at once, each equal to step_time's to the last bit: a few
        in Python (step_time's operations, without a StepShape each), more on float64 arrays (the same
        operations in the same order, while the KV-token products stay exact in a double: below 2**53;
        beyond, in Python too)."""
        flops, bw, n = self.device.flops, self.device.bandwidth, num_seqs
        # the parts that do not change with the context, as step_time computes them
        linear = max((2 * self.linear_params * n + 2 * self.head_params * n) / flops, self.weight_bytes / bw)
        kv_write = self.kv_bytes_per_token * n / bw
        overhead = 1e-6 * (self.device.step_overhead_us + self.device.seq_overhead_us * n)
        attn, kv_bytes = self.attn_flops_per_pair, self.kv_bytes_per_token
        last = first_context + (count - 1) * n
        if count <= _FEW_STEPS or max(attn, kv_bytes) * last >= 2**53:
            return [
                linear + 0.0 + max(attn * c / flops, kv_bytes * c / bw) + kv_write + overhead
                for c in range(first_context, last + 1, n)
            ]
        context = first_context + n * np.arange(count, dtype=np.int64)
        decode = np.maximum(attn * context / flops, kv_bytes * context / bw)
        return ((((linear + 0.0) + decode) + kv_write) + overhead).tolist()
