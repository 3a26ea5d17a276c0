"""A/B of two kernel=cpu kernels against the alternatives, on SmolLM2-135M's shapes, fp32, same run.

prefill attention: testbed_kernels/cpu/paged_prefill.cpp (one call over the paged cache) vs the path it replaced
    (gather the sequence's K/V from its blocks, then torch's scaled_dot_product_attention, causal, or with an
    explicit mask for a chunk after a cached prefix). Both in this process, alternating, best of the repeats.
linear layers with few rows: linear.cpp's kernel on packed weights (next panel prefetched into L2) vs the
    same without the prefetch (TESTBED_CPU_LINEAR_PREFETCH=0) vs torch's GEMM on the plain weights, over 30
    layers of distinct weights (424 MB: memory-bound, as a decode step is), each mode in a fresh process per
    round, modes interleaved (order reversed every other round).

    python -m benchmarks.cpu_kernels                       # -> results/kernels/cpu_kernels.{md,json}
    python -m benchmarks.cpu_kernels --rounds 4 --threads 1
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "kernels"
# SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64; its four linear layers [out, in]
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
LINEARS = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
MODES = ("packed", "packed-no-prefetch", "torch")


def best_seconds(fn, calls: int, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def prefill_shape(q_len: int, ctx_len: int, repeats: int, batch_pairs: int = 2_000_000) -> dict:
    """One sequence's chunk of q_len queries at the end of ctx_len cached tokens, both paths; a timed batch
    is as many calls as take about batch_pairs (query, key) pairs."""
    import torch
    import torch.nn.functional as F

    import testbed_kernels.cpu as cpu_kernels
    from testbed_kernels.reference import gather_kv_ref

    num_blocks = -(-ctx_len // BLOCK)
    k_cache = torch.randn(num_blocks + 4, BLOCK, KV_HEADS, HEAD_DIM)
    v_cache = torch.randn(num_blocks + 4, BLOCK, KV_HEADS, HEAD_DIM)
    table = torch.randperm(num_blocks + 4)[:num_blocks].int()
    q = torch.randn(q_len, HEADS, HEAD_DIM)
    chunks = torch.tensor([[0, 0, q_len, ctx_len]])
    scale = HEAD_DIM**-0.5
    mask, causal = None, True
    if q_len < ctx_len:  # a chunk after a cached prefix: query i sees keys up to its position
        q_pos = torch.arange(ctx_len - q_len, ctx_len).unsqueeze(1)
        mask, causal = torch.arange(ctx_len).unsqueeze(0) <= q_pos, False

    def flash():
        return cpu_kernels.paged_prefill(q, k_cache, v_cache, table[None], chunks, scale)

    def gather_sdpa():
        k = gather_kv_ref(k_cache, table, ctx_len).transpose(0, 1)[None]
        v = gather_kv_ref(v_cache, table, ctx_len).transpose(0, 1)[None]
        return F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
        )[0].transpose(0, 1)

    err = (flash() - gather_sdpa()).abs().max().item()
    calls = max(1, batch_pairs // (q_len * ctx_len))
    times = {"flash": [], "gather_sdpa": []}
    for r in range(repeats):  # alternate, so drift in the machine's speed hits both alike
        for name, fn in (("flash", flash), ("gather_sdpa", gather_sdpa))[:: 1 if r % 2 == 0 else -1]:
            times[name].append(best_seconds(fn, calls, 3))
    pairs = q_len * ctx_len - q_len * (q_len - 1) // 2  # (query, visible key) pairs
    flops = 4 * pairs * HEADS * HEAD_DIM
    t_new, t_old = min(times["flash"]), min(times["gather_sdpa"])
    print(f"[cpu_kernels] prefill {q_len}/{ctx_len}: {t_new * 1e3:.2f} vs {t_old * 1e3:.2f} ms", file=sys.stderr)
    return {
        "q_len": q_len,
        "ctx_len": ctx_len,
        "flash_ms": t_new * 1e3,
        "gather_sdpa_ms": t_old * 1e3,
        "speedup": t_old / t_new,
        "flash_gflops": flops / t_new / 1e9,
        "gather_sdpa_gflops": flops / t_old / 1e9,
        "max_abs_diff": err,
        "runs_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in times.items()},
    }


def linear_child(mode: str, rows_list: list[int], layers: int, repeats: int) -> dict:
    """Seconds per pass over `layers` layers at each row count, in `mode` (the prefetch switch is read from
    the environment when the extension loads)."""
    import torch

    import testbed_kernels.cpu as cpu_kernels

    cpu_kernels.load()
    weights = [torch.randn(n, k) for _ in range(layers) for n, k in LINEARS]
    packed = [cpu_kernels.pack_linear(w) if mode != "torch" else None for w in weights]
    return {str(m): best_seconds(lambda m=m: linear_pass(weights, packed, m), 1, repeats) for m in rows_list}


def linear_pass(weights, packed, rows: int) -> None:
    import torch

    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights[: len(LINEARS)]}
    for w, p in zip(weights, packed):
        if p is None:
            torch.nn.functional.linear(xs[w.shape[1]], w)
        else:
            torch.ops.testbed_cpu.linear_packed(xs[w.shape[1]], p, w.shape[0], None)


def linear_modes(rows_list: list[int], layers: int, rounds: int, threads: int) -> list[dict]:
    runs = []
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            env = dict(os.environ, TESTBED_CPU_LINEAR_PREFETCH="0" if mode == "packed-no-prefetch" else "1")
            cmd = [sys.executable, "-m", "benchmarks.cpu_kernels", "--linear-child", mode, "--threads", str(threads)]
            cmd += ["--layers", str(layers), "--rows", *map(str, rows_list)]
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"cpu_kernels: the {mode} run failed:\n{proc.stderr[-3000:]}")
            runs.append({"mode": mode, "round": r + 1, "seconds": json.loads(proc.stdout.splitlines()[-1])})
            print(f"[cpu_kernels] linear {mode} (round {r + 1}/{rounds}): {runs[-1]['seconds']}", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="prefill: alternations per shape")
    p.add_argument(
        "--batch-pairs",
        type=int,
        default=2_000_000,
        help="prefill: calls per timed batch cover ~this many (q, k) pairs",
    )
    p.add_argument("--rounds", type=int, default=3, help="linear: processes per mode")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256])
    p.add_argument("--prefill", type=str, nargs="+", default=["64/64", "256/256", "512/512", "1024/1024", "256/512"])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--linear-child", choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    if a.linear_child:
        print(json.dumps(linear_child(a.linear_child, a.rows, a.layers, 5)))
        return 0
    # here, not at the top: a child (one per mode per round) would import pandas with it for nothing
    from benchmarks.common import environment, load_average, markdown_table, publish

    env = {**environment(), "load_before": load_average(), "threads": a.threads}
    shapes = [tuple(int(v) for v in s.split("/")) for s in a.prefill]
    import testbed_kernels.cpu as cpu_kernels

    cpu_kernels.load()
    prefill = [prefill_shape(q_len, ctx_len, a.repeats, a.batch_pairs) for q_len, ctx_len in shapes]
    linear = linear_modes(a.rows, a.layers, a.rounds, a.threads)
    env["load_after"] = load_average()

    prefill_rows = [
        [f"{r['q_len']} / {r['ctx_len']}", f"{r['flash_ms']:.3f}", f"{r['gather_sdpa_ms']:.3f}", f"{r['speedup']:.2f}x"]
        + [f"{r['flash_gflops']:.0f} / {r['gather_sdpa_gflops']:.0f}", f"{r['max_abs_diff']:.1e}"]
        for r in prefill
    ]
    best = {
        m: {k: min(run["seconds"][k] for run in linear if run["mode"] == m) for k in map(str, a.rows)} for m in MODES
    }
    linear_rows = [
        [m, *(f"{best[mode][m] * 1e3:.1f}" for mode in MODES)]
        + [f"{best['torch'][m] / best['packed'][m]:.2f}x", f"{best['packed-no-prefetch'][m] / best['packed'][m]:.2f}x"]
        + [" / ".join(f"{run['seconds'][m] * 1e3:.1f}" for run in linear if run["mode"] == mode) for mode in MODES]
        for m in map(str, a.rows)
    ]
    md = (
        "# kernel=cpu kernels vs what they replaced (same run)\n\n"
        f"SmolLM2-135M shapes, fp32, {a.threads} threads; {env['cpu']} ({env['cpu_count']} cores).\n\n"
        "## Prefill attention: paged_prefill.cpp vs gather + torch SDPA\n\n"
        f"One sequence ({HEADS} query heads, {KV_HEADS} KV heads, head_dim {HEAD_DIM}, block size {BLOCK}, "
        f"blocks shuffled); best of {a.repeats} alternations of 3 timed batches each. q_len / ctx_len below "
        "ctx_len: a chunk after a cached prefix (the old path's explicit mask). GFLOP/s count the causal "
        "pairs only.\n\n"
        + markdown_table(
            ["q_len / ctx_len", "flash ms", "gather+SDPA ms", "speed-up", "GFLOP/s (flash / old)", "max |diff|"],
            prefill_rows,
        )
        + "\n\n## Linear layers with few rows: linear.cpp on packed weights vs without its prefetch vs torch\n\n"
        f"{a.layers} layers of distinct weights ({sum(n * k for n, k in LINEARS) * 4 * a.layers / 1e6:.0f} MB, "
        f"more than the caches), one pass = every layer's four linears; best of 5 passes per process, "
        f"{a.rounds} processes per mode, interleaved.\n\n"
        + markdown_table(
            ["rows", "packed ms", "packed, no prefetch ms", "torch GEMM ms", "vs torch", "vs no prefetch"]
            + [f"{mode} runs" for mode in MODES],
            linear_rows,
        )
        + f"\n\n- date {env['date']}; git {env['git']}; torch {env['torch']}\n"
    )
    data = {"config": vars(a) | {"out": str(a.out)}, "prefill": prefill, "linear": linear}
    publish(a.out, "cpu_kernels", md, env, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
