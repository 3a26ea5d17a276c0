"""The roofline bound of a throughput workload: weights + KV bytes over measured bandwidth, FLOPs over the
measured matmul rate (experiments/bench_throughput.py prints it beside each system's rate)."""

import math
import time


def model_numbers(hf_config: dict, dtype_bytes: int) -> dict:
    h, i, L = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["num_hidden_layers"]
    heads = hf_config["num_attention_heads"]
    kvh = hf_config.get("num_key_value_heads") or heads
    d = hf_config.get("head_dim") or h // heads
    vocab = hf_config["vocab_size"]
    per_layer = h * (heads + 2 * kvh) * d + heads * d * h + 3 * h * i + 2 * h
    body = L * per_layer + h  # + final norm
    return {
        "layers": L,
        "heads": heads,
        "head_dim": d,
        "lm_head_params": vocab * h,
        "body_params": body,
        # per decode step every weight is read once: body + lm_head (tied or not, the matrix is read)
        "step_weight_bytes": (body + vocab * h) * dtype_bytes,
        "kv_bytes_per_token": 2 * L * kvh * d * dtype_bytes,
    }


def workload_bound(prompts, outputs, numbers: dict, max_batch: int, bandwidth: float, flops_rate: float) -> dict:
    """A lower bound on the time any engine needs for this workload on this device.

    memory: weights are read at least once per forward, and there are at least max(longest output,
    total outputs / max batch) sequential forwards; every decode token reads its context's KV once.
    compute: 2 * params FLOPs per processed token (lm_head only where a token is sampled) + attention
    (QK^T and PV: 4 * layers * heads * head_dim per (query, key) pair, causal within a prompt).
    """
    lens = [len(p) for p in prompts]
    total_out = sum(outputs)
    steps = max(max(outputs), math.ceil(total_out / max_batch))
    kv_tokens_read = sum((o - 1) * p + o * (o - 1) // 2 for p, o in zip(lens, outputs))  # sum_{j=1}^{o-1} (p + j)
    bytes_total = steps * numbers["step_weight_bytes"] + kv_tokens_read * numbers["kv_bytes_per_token"]
    processed = sum(p + o - 1 for p, o in zip(lens, outputs))
    attn_per_pair = 4 * numbers["layers"] * numbers["heads"] * numbers["head_dim"]
    pairs = sum(p * (p + 1) // 2 for p in lens) + kv_tokens_read
    flops = 2 * numbers["body_params"] * processed + 2 * numbers["lm_head_params"] * total_out + attn_per_pair * pairs
    t_mem, t_flops = bytes_total / bandwidth, flops / flops_rate
    return {
        "bytes": bytes_total,
        "flops": flops,
        "min_forwards": steps,
        "t_memory_s": t_mem,
        "t_compute_s": t_flops,
        "bound_s": max(t_mem, t_flops),
        "bound_output_tok_s": total_out / max(t_mem, t_flops),
        "bandwidth_Bps": bandwidth,
        "flops_per_s": flops_rate,
    }


def fastest_device(measurements: list[dict]) -> dict:
    """The bound from several measurements of the device (one per benchmark round): the highest bandwidth
    and matmul rate seen, so that a measurement taken in a slow moment of a shared machine cannot loosen
    the bound and flatter the systems' "of roofline". Failed measurements (no rates) are skipped."""
    ok = [m for m in measurements if "bandwidth_Bps" in m and "flops_per_s" in m]
    if not ok:
        return measurements[0] if measurements else {}
    rates = [m["flops_per_s"] for m in ok]
    return dict(
        max(ok, key=lambda m: m["flops_per_s"]),
        bandwidth_Bps=max(m["bandwidth_Bps"] for m in ok),
        measurements=len(ok),
        flops_range=[min(rates), max(rates)],
    )


def cuda_time_ms(fn, iters=10) -> float:
    """Mean milliseconds per call of fn on the GPU (one warm-up call, CUDA events)."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def measure_device(device: str, dtype) -> dict:
    """Measured copy bandwidth (bytes read + written per second) and dense matmul rate in the run's dtype."""
    import torch

    if device == "cuda":
        t_ms = cuda_time_ms
        src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        bw = 2 * src.numel() / (t_ms(lambda: dst.copy_(src)) / 1e3)
        del src, dst
        n = 8192
        a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
        rate = 2 * n**3 / (t_ms(lambda: a @ b) / 1e3)
        return {"bandwidth_Bps": bw, "flops_per_s": rate, "matmul": f"{n}^3 {dtype}", "copy": "1 GiB d2d"}

    def best(fn, iters=5):
        fn()
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    src = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB
    dst = torch.empty_like(src)
    bw = 2 * src.numel() * 4 / best(lambda: dst.copy_(src))
    n = 2048
    a, b = (torch.randn(n, n, dtype=dtype) for _ in range(2))
    rate = 2 * n**3 / best(lambda: a @ b)
    return {
        "bandwidth_Bps": bw,
        "flops_per_s": rate,
        "matmul": f"{n}^3 {dtype}",
        "copy": "256 MiB host copy",
        "note": "best of 5 (the machine is shared)",
    }
