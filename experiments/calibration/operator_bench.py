"""Microbenchmarks of one engine's operators, for the operator-level cost model
(testbed/sim/cost_models/operators.py, after Vidur's operator profiling, Agrawal et al., MLSys 2024).

Every operator runs through the engine's own kernel backend (`model.ops`) on the engine's own weights
(layer 0; the per-layer figures are multiplied by the layer count when priced), on the engine's device and
dtype. Attention reads and writes a private one-layer paged KV cache of the engine's block size, so the
engine's own cache (and its prefix-cache contents) is untouched. Each point is the median of a few timed
calls after one untimed call; on CUDA every call is synchronised.
"""

import statistics
import time

import torch

from experiments.calibration.refine import refine
from testbed.attention.backend import AttentionMetadata
from testbed.executor.kv_cache import allocate_kv_cache, kv_cache_dtype

POOL_TOKENS = 1 << 16  # KV slots of the private cache; larger decode batches reuse blocks (wrap around)


def _powers(limit: int, start: int = 1) -> list[int]:
    out, n = [], start
    while n < limit:
        out.append(n)
        n *= 4
    return [*out, limit]


def _dense(limit: int, segments: int = 32, every_row: int = 64) -> list[int]:
    """Every row count up to `every_row`, then evenly spaced (at least 16 apart) to the limit: the start grid of the
    linear layers. Their time per row changes abruptly where a kernel changes code path (refine.py) and, below a
    few dozen rows, at each multiple of the packed kernel's row tile (12 rows with AVX-512: 11.0 ms at 12 rows, 17.0
    at 13 over SmolLM2's 30 layers on 2026-12-04's VM), a staircase no midpoint test finds."""
    step = max(16, -(-limit // segments))
    return sorted(set(range(1, min(limit, every_row) + 1)) | set(range(every_row, limit, step)) | {limit})


def grids(max_tokens: int, max_seqs: int, max_len: int, quick: bool) -> dict:
    """Points per operator, bounded by the engine's limits (the model's context, the scheduler's budget)."""
    few = lambda limit: sorted({n for n in (1, 8, 64) if n < limit} | {limit})
    tokens = few(max_tokens) if quick else _powers(max_tokens)
    chunks = [q for q in ((16, 128) if quick else (16, 64, 256, 1024)) if q <= max_tokens]
    before = (0, 256) if quick else (0, 256, 1024, 4096)
    return {
        "tokens": tokens,
        "linear": tokens if quick else _dense(max_tokens),
        "logits": few(max_seqs) if quick else _powers(max_seqs),
        "prefill": [(q, c) for q in chunks or [max_tokens] for c in before if q + c <= max_len],
        "decode": [
            (b, ctx)
            for b in ((1, 8) if quick else _powers(max_seqs))
            for ctx in ((64, 512) if quick else (64, 512, 2048))
            if ctx <= max_len
        ],
    }


class _Timer:
    def __init__(self, device: torch.device, repeats: int):
        self.cuda = device.type == "cuda"
        self.repeats = repeats

    def __call__(self, fn, *args) -> float:
        fn(*args)  # untimed: allocations, kernel selection
        times = []
        for _ in range(self.repeats):
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(*args)
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def _meta(query_lens: list[int], seq_lens: list[int], block_size: int, num_blocks: int, device) -> AttentionMetadata:
    """Sequences on distinct blocks (wrapping around the private pool), new tokens at the end of each."""
    tables, slots, next_block = [], [], 0
    width = max(-(-n // block_size) for n in seq_lens)
    for q, n in zip(query_lens, seq_lens):
        blocks = [(next_block + i) % num_blocks for i in range(-(-n // block_size))]
        next_block += len(blocks)
        tables.append(blocks + [0] * (width - len(blocks)))
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(n - q, n)]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    i32 = dict(dtype=torch.int32, device=device)
    return AttentionMetadata(
        torch.tensor(slots, dtype=torch.int64, device=device),
        torch.tensor(starts, **i32),
        torch.tensor(seq_lens, **i32),
        torch.tensor(tables, **i32),
        max(query_lens),
        max(seq_lens),
    )


@torch.inference_mode()
def operator_samples(engine, quick: bool = False, repeats: int = 3) -> dict:
    """{"layers": L, operator: [(x..., seconds)]} for linear, norm_act, logits (by rows), attn_prefill (by
    chunk, context before it) and attn_decode (by rows, total KV tokens read). linear's grid is refined where
    its time per row bends (refine.py)."""
    model, cfg, arch, device = engine.model, engine.config, engine.arch, engine.device
    ops, layer, dtype = model.ops, model.model.layers[0], engine.dtype
    attn = layer.self_attn
    timer, steady = _Timer(device, repeats), _Timer(device, max(repeats, 5))
    g = grids(cfg.scheduler.max_num_batched_tokens, cfg.scheduler.max_num_seqs, engine.max_model_len, quick)
    randn = lambda *shape: torch.randn(*shape, dtype=dtype, device=device)
    out: dict = {"layers": arch.num_hidden_layers, "norm_act": [], "logits": []}

    layers = list(model.model.layers)

    # every layer in turn, as a step runs them: one layer called again and again keeps its weights in cache and times
    # compute, not the weights a step streams from memory (results/fidelity/v18_2026-12-04/hot_cold.txt)
    def linear(x, attn_out, inter):
        for each in layers:
            each.self_attn.qkv_proj(x), each.self_attn.o_proj(attn_out)
            each.mlp.gate_up_proj(x), each.mlp.down_proj(inter)

    def norm_act(x, residual, positions, q, k, gate_up):
        layer.input_layernorm(x, residual.clone())
        ops.rotary(positions, q.clone(), k.clone(), model.cos_sin)
        layer.post_attention_layernorm(x, residual.clone())
        ops.silu_and_mul(gate_up)

    def logits(h):
        model.compute_logits(model.model.norm(h, h.clone())[0]).argmax(-1).tolist()

    def linear_seconds(n: int) -> float:  # per layer; 5 calls at least: one slow call must not pass for a cliff
        x, attn_out, inter = randn(n, arch.hidden_size), randn(n, attn.q_size), randn(n, arch.intermediate_size)
        return steady(linear, x, attn_out, inter) / len(layers)

    # split where the backend changes code path (a cliff in time per row), not only at the grid's points
    out["linear"] = refine(linear_seconds, g["linear"], budget=4 if quick else 24, retimes=4 if quick else 12)
    for n in g["tokens"]:
        x = randn(n, arch.hidden_size)
        qk = randn(n, attn.num_heads, attn.head_dim), randn(n, attn.num_kv_heads, attn.head_dim)
        positions = torch.arange(n, device=device) % engine.max_model_len
        gate_up = randn(n, 2 * arch.intermediate_size)
        out["norm_act"].append((n, timer(norm_act, x, randn(n, arch.hidden_size), positions, *qk, gate_up)))
    for m in g["logits"]:
        out["logits"].append((m, timer(logits, randn(m, arch.hidden_size))))
    block_size = cfg.cache.block_size
    num_blocks = max(1, POOL_TOKENS // block_size)
    k_cache, v_cache = allocate_kv_cache(arch, num_blocks, block_size, 1, kv_cache_dtype(cfg.cache, dtype), device)[0]

    def attention(query_lens, seq_lens):
        meta = _meta(query_lens, seq_lens, block_size, num_blocks, device)
        rows = sum(query_lens)
        q = randn(rows, attn.num_heads, attn.head_dim)
        k, v = randn(rows, attn.num_kv_heads, attn.head_dim), randn(rows, attn.num_kv_heads, attn.head_dim)
        return timer(ops.attention, q, k, v, k_cache, v_cache, meta, attn.scale)

    out["attn_prefill"] = [(q, c, attention([q], [c + q])) for q, c in g["prefill"]]
    out["attn_decode"] = [(b, b * ctx, attention([1] * b, [ctx] * b)) for b, ctx in g["decode"]]
    return out
