"""GPU check of the Triton kernels: correctness vs the torch references at realistic bf16 shapes,
timings vs torch SDPA / the references, and decode attention's achieved bandwidth (KV bytes read /
time) against a measured device-to-device copy bandwidth.

    python experiments/gpu_kernel_check.py results/gpu_kernel_check.json
    TRITON_INTERPRET=1 python experiments/gpu_kernel_check.py /tmp/x.json --smoke   # CPU dry run, tiny shapes
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TOL = 2e-2  # bf16: max |out - ref| / max |ref|
# (name, heads, kv_heads, head_dim, hidden, intermediate)
MODELS = [("smollm2-135m", 9, 3, 64, 576, 1536), ("llama-8b", 32, 8, 128, 4096, 14336)]
DECODE = [(1, 8000, 16), (32, 2000, 16), (128, 1000, 16), (32, 4000, 64)]  # (seqs, ctx, block_size)
PREFILL = [(4, 1024, 0, 16), (2, 512, 1500, 16)]  # (seqs, query len, cached prefix, block_size)
SMOKE_DECODE, SMOKE_PREFILL = [(2, 70, 16)], [(2, 20, 9, 16)]


def timer(fn, iters, flush):
    """Median ms per call; the L2 is flushed before each call so small KV caches are not cache hits."""
    fn()
    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    times = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel_err(out, ref):
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def paged_cache(seqs, ctx, kvh, hd, bs, dev, dt):
    per_seq = -(-ctx // bs)
    k = torch.randn(seqs * per_seq, bs, kvh, hd, device=dev, dtype=dt)
    tables = torch.randperm(seqs * per_seq, device=dev).view(seqs, per_seq).to(torch.int32)
    return k, torch.randn_like(k), tables, torch.full((seqs,), ctx, dtype=torch.int32, device=dev)


def contiguous_kv(cache, tables, ctx):
    """[seqs, kv_heads, ctx, d]: the same KV un-paged, for SDPA baselines."""
    seqs = tables.shape[0]
    return cache[tables.long()].reshape(seqs, -1, *cache.shape[2:])[:, :ctx].transpose(1, 2).contiguous()


def check_decode(model, cfg, env):
    from testbed_kernels.reference import paged_attention_ref
    from testbed_kernels.triton_paged_decode import choose_num_splits, paged_decode

    _, h, kvh, hd, _, _ = model
    seqs, ctx, bs = cfg
    dev, dt, T = env["dev"], env["dt"], env["timer"]
    kc, vc, tables, lens = paged_cache(seqs, ctx, kvh, hd, bs, dev, dt)
    q = torch.randn(seqs, h, hd, device=dev, dtype=dt)
    scale = hd**-0.5
    ref = paged_attention_ref(q, kc, vc, torch.arange(seqs + 1, device=dev, dtype=torch.int32), lens, tables, scale)
    rows = []
    auto = choose_num_splits(seqs, kvh, ctx, q.device)
    for splits in sorted({1, auto}):
        out = paged_decode(q, kc, vc, lens, tables, scale, max_seq_len=ctx, num_splits=splits)
        ms = T(lambda s=splits: paged_decode(q, kc, vc, lens, tables, scale, max_seq_len=ctx, num_splits=s))
        kv_bytes = 2 * seqs * ctx * kvh * hd * kc.element_size()
        rows.append(
            {
                "kernel": "decode",
                "config": f"{model[0]} b{seqs} ctx{ctx} bs{bs} split{splits}",
                "err": rel_err(out, ref),
                "ms": ms,
                "gbps": kv_bytes / ms / 1e6,
            }
        )
    kd, vd = contiguous_kv(kc, tables, ctx), contiguous_kv(vc, tables, ctx)
    qd = q.unsqueeze(2)  # [b, h, 1, d]
    base = T(lambda: F.scaled_dot_product_attention(qd, kd, vd, scale=scale, enable_gqa=True))
    for r in rows:
        r.update(baseline="sdpa(contiguous)", base_ms=base)
    return rows


def check_prefill(model, cfg, env):
    from testbed_kernels.reference import paged_attention_ref
    from testbed_kernels.triton_paged_prefill import paged_prefill

    _, h, kvh, hd, _, _ = model
    seqs, qlen, prefix, bs = cfg
    dev, dt, T = env["dev"], env["dt"], env["timer"]
    ctx = prefix + qlen
    kc, vc, tables, lens = paged_cache(seqs, ctx, kvh, hd, bs, dev, dt)
    q = torch.randn(seqs * qlen, h, hd, device=dev, dtype=dt)
    qsl = torch.arange(0, seqs * qlen + 1, qlen, device=dev, dtype=torch.int32)
    args = (q, kc, vc, qsl, lens, tables, hd**-0.5)
    err = rel_err(paged_prefill(*args, max_query_len=qlen), paged_attention_ref(*args))
    ms = T(lambda: paged_prefill(*args, max_query_len=qlen))
    kd, vd = contiguous_kv(kc, tables, ctx), contiguous_kv(vc, tables, ctx)
    qd = q.view(seqs, qlen, h, hd).transpose(1, 2)
    # bottom-right causal mask: query i sits at position prefix + i
    mask = torch.arange(ctx, device=dev)[None, :] <= torch.arange(prefix, ctx, device=dev)[:, None]
    base = T(
        lambda: F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=None if prefix == 0 else mask, is_causal=prefix == 0, scale=hd**-0.5, enable_gqa=True
        )
    )
    return [
        {
            "kernel": "prefill",
            "config": f"{model[0]} b{seqs} q{qlen} prefix{prefix} bs{bs}",
            "err": err,
            "ms": ms,
            "baseline": "sdpa(contiguous)",
            "base_ms": base,
        }
    ]


def check_layer_ops(model, tokens, env):
    from testbed_kernels import reference as R
    from testbed_kernels.triton_kv_write import write_kv
    from testbed_kernels.triton_rms_norm import rms_norm
    from testbed_kernels.triton_rotary import rotary
    from testbed_kernels.triton_silu_mul import silu_and_mul

    name, h, kvh, hd, hidden, inter = model
    dev, dt, T = env["dev"], env["dt"], env["timer"]
    x, res = (torch.randn(tokens, hidden, device=dev, dtype=dt) for _ in range(2))
    w = torch.randn(hidden, device=dev, dtype=dt)
    gu = torch.randn(tokens, 2 * inter, device=dev, dtype=dt)
    q, k = torch.randn(tokens, h, hd, device=dev, dtype=dt), torch.randn(tokens, kvh, hd, device=dev, dtype=dt)
    cos_sin = torch.randn(8192, hd, device=dev)
    pos = torch.randint(0, 8192, (tokens,), device=dev)
    kc = [torch.zeros(2 * tokens // 16, 16, kvh, hd, device=dev, dtype=dt) for _ in range(4)]
    slots = torch.randperm(2 * tokens, device=dev)[:tokens]
    write_kv(k, q[:, :kvh], kc[0], kc[1], slots)
    R.write_kv_ref(k, q[:, :kvh], kc[2], kc[3], slots)
    cases = [
        (
            "kv_write",
            float(not (torch.equal(kc[0], kc[2]) and torch.equal(kc[1], kc[3]))),
            lambda: write_kv(k, q[:, :kvh], kc[0], kc[1], slots),
            lambda: R.write_kv_ref(k, q[:, :kvh], kc[2], kc[3], slots),
        ),
        (
            "rms_norm",
            rel_err(rms_norm(x, w, 1e-6), R.rms_norm_ref(x, w, 1e-6)),
            lambda: rms_norm(x, w, 1e-6),
            lambda: R.rms_norm_ref(x, w, 1e-6),
        ),
        (
            "rms_norm+res",
            rel_err(rms_norm(x, w, 1e-6, res)[0], R.rms_norm_ref(x, w, 1e-6, res)[0]),
            lambda: rms_norm(x, w, 1e-6, res),
            lambda: R.rms_norm_ref(x, w, 1e-6, res),
        ),
        (
            "silu_and_mul",
            rel_err(silu_and_mul(gu), R.silu_and_mul_ref(gu)),
            lambda: silu_and_mul(gu),
            lambda: R.silu_and_mul_ref(gu),
        ),
        (
            "rotary",
            max(rel_err(a, b) for a, b in zip(rotary(pos, q, k, cos_sin), R.rotary_ref(pos, q, k, cos_sin))),
            lambda: rotary(pos, q, k, cos_sin),
            lambda: R.rotary_ref(pos, q, k, cos_sin),
        ),
    ]
    return [
        {
            "kernel": kname,
            "config": f"{name} t{tokens}",
            "err": err,
            "ms": T(fn),
            "baseline": "torch ref",
            "base_ms": T(ref),
        }
        for kname, err, fn, ref in cases
    ]


def copy_bandwidth_gbps(env, nbytes):
    src = torch.empty(nbytes, dtype=torch.uint8, device=env["dev"])
    dst = torch.empty_like(src)
    ms = env["timer"](lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6  # read + write


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_json")
    p.add_argument("--smoke", action="store_true", help="tiny shapes; on CPU needs TRITON_INTERPRET=1")
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    if not torch.cuda.is_available() and not (a.smoke and os.environ.get("TRITON_INTERPRET") == "1"):
        sys.exit(
            "gpu_kernel_check: CUDA is not available; this script times kernels on a GPU. "
            "(For a CPU dry run: TRITON_INTERPRET=1 ... --smoke)"
        )
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    flush = torch.empty(256 * 2**20 if dev == "cuda" else 1, dtype=torch.int8, device=dev)
    env = {"dev": dev, "dt": torch.bfloat16, "timer": lambda fn, iters=a.iters: timer(fn, iters, flush)}
    torch.manual_seed(0)
    copy_bw = copy_bandwidth_gbps(env, 2**30 if dev == "cuda" else 2**20)
    rows = []
    for model in MODELS:
        for cfg in SMOKE_DECODE if a.smoke else DECODE:
            rows += check_decode(model, cfg, env)
        for cfg in SMOKE_PREFILL if a.smoke else PREFILL:
            rows += check_prefill(model, cfg, env)
        rows += check_layer_ops(model, 8 if a.smoke else 4096, env)
    for r in rows:
        r["ok"] = r["err"] <= TOL
        r["speedup"] = r["base_ms"] / r["ms"]
        if "gbps" in r:
            r["pct_copy_bw"] = 100 * r["gbps"] / copy_bw
    print(
        f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu (interpreter)'}; "
        f"d2d copy bandwidth {copy_bw:.0f} GB/s"
    )
    print(f"{'kernel':<13} {'config':<40} {'err':>8} {'ok':>3} {'ms':>9} {'base ms':>9} {'x':>6}  bandwidth")
    for r in rows:
        bw = f"{r['gbps']:.0f} GB/s ({r['pct_copy_bw']:.0f}% of copy)" if "gbps" in r else ""
        print(
            f"{r['kernel']:<13} {r['config']:<40} {r['err']:8.1e} {'y' if r['ok'] else 'N':>3} "
            f"{r['ms']:9.3f} {r['base_ms']:9.3f} {r['speedup']:6.2f}  {bw}"
        )
    meta = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "copy_bw_gbps": copy_bw,
        "tolerance": TOL,
        "smoke": a.smoke,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out_json)), exist_ok=True)
    with open(a.out_json, "w") as f:
        json.dump(dict(meta, results=rows), f, indent=1)
    print(f"wrote {a.out_json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
