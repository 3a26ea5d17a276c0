"""Offline throughput: this engine vs Hugging Face transformers, same workload, same device, same run.

Workload (nano-vllm's published benchmark): N requests with random token ids, prompt and output lengths
uniform in the given ranges, EOS ignored (every request produces exactly its output length), greedy.
Systems, each in a fresh subprocess (its own memory, caches and threads), one after another:

    engine-triton   this engine, kernel=triton (on CUDA: bf16, CUDA-graph decode)
    engine-cpu      this engine, kernel=cpu (C++ paged decode + torch flash SDPA; the CPU preset's engine)
    engine-torch    this engine, kernel=torch (the readable reference kernels, eager)
    hf-static       transformers `generate` on left-padded batches of a fixed size (one row per batch size)
    hf-cb           transformers continuous batching (`init_continuous_batching`, the engine behind
                    `generate_batch`), with per-request output lengths

Each reports output tokens/s = (sum of the requests' output lengths) / wall time from submitting the
work to the last token, excluding model load and warm-up. The roofline bound for the workload comes from
the device's measured copy bandwidth and matmul rate (see `roofline`). Results: <out>/<name>.json and
.md, the table printed last.

    python -m benchmarks.throughput --preset gpu            # llama-3.2-1b shape, bf16, 256 requests
    python -m benchmarks.throughput --preset gpu --model llama-3.1-8b
    python -m benchmarks.throughput --preset cpu            # smollm2-135m real weights, fp32, 32 requests
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    environment,
    load_average,
    markdown_table,
    write_json,
)
from benchmarks.roofline import model_numbers, workload_bound
from benchmarks.systems import make_workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "throughput"
SYSTEMS = ("engine-triton", "engine-cpu", "engine-torch", "hf-static", "hf-cb")

PRESETS = {
    "gpu": dict(
        model="llama-3.2-1b",
        dtype="bfloat16",
        num_requests=256,
        prompt_range=(100, 1024),
        output_range=(100, 1024),
        token_range=(0, 10000),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        hf_batch_sizes=[256],
        systems=["engine-triton", "engine-torch", "hf-static", "hf-cb"],
    ),
    "cpu": dict(
        model="smollm2-135m",
        dtype="float32",
        num_requests=32,
        prompt_range=(32, 512),
        output_range=(16, 128),
        token_range=(0, 10000),
        max_num_seqs=32,
        max_num_batched_tokens=1024,
        hf_batch_sizes=[8, 32],
        systems=["engine-cpu", "engine-torch", "hf-static", "hf-cb"],
    ),
}


# ---- orchestration ---------------------------------------------------------------------------------------
def pick_threads() -> tuple[int, dict]:
    """CPU: the intra-op thread count for every system, by a quick timing (on a machine shared with other
    processes, OpenMP barriers across 2 threads can be many times slower than 1 thread)."""
    import torch

    timings = {}
    for n in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(n)
        x, w = torch.randn(32, 576), torch.randn(3072, 576)
        y = torch.randn(32, 1536)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                torch.nn.functional.silu(y)
                x @ w.T
            best = min(best, time.perf_counter() - t)
        timings[n] = best
    return min(timings, key=timings.get), {str(k): v for k, v in timings.items()}


def run_system(spec: dict, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_file.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        if spec["device"] != "cuda" and spec["system"] == "engine-triton":
            env["TRITON_INTERPRET"] = "1"
        load = load_average()
        t = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.systems", str(spec_file), str(out_file)],
                cwd=ROOT,
                env=env,
                timeout=timeout_s,
                capture_output=True,
                text=True,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s", "load_before": load}
        wall = time.perf_counter() - t
        if proc.returncode != 0 or not out_file.exists():
            tail = (proc.stderr or proc.stdout)[-1500:]
            return {
                "error": f"exit {proc.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}",
                "stderr_tail": tail,
                "load_before": load,
            }
        result = json.loads(out_file.read_text())
        result.update(process_wall_s=wall, load_before=load, load_after=load_average())
        return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: gpu if CUDA is available")
    p.add_argument("--model")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS)
    p.add_argument("--num-requests", type=int)
    p.add_argument("--hf-batch-sizes", type=int, nargs="+")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument(
        "--time-limit",
        type=float,
        default=300,
        help="per system (hf-static measures whole batches until this much time has passed; others are stopped at 2x)",
    )
    p.add_argument(
        "--system-timeout",
        type=float,
        help="seconds before a system's process is stopped (default: 2 * time-limit + 300)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        help="CPU: torch threads for every system (default: the faster of 1 and all cores by a quick timing)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the systems this many times, interleaved; "
        "each system's best run is reported (all runs are in the JSON)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", help="result file stem (default: <preset>-<model>)")
    a = p.parse_args()

    import torch

    preset_name = a.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    cfg = dict(PRESETS[preset_name])
    for key in ("model", "systems", "num_requests", "hf_batch_sizes", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    device = "cuda" if preset_name == "gpu" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_throughput: the gpu preset needs CUDA", file=sys.stderr)
        return 2
    from testbed.models.registry import resolve_model

    hf_config = resolve_model(cfg["model"]).hf_config
    cfg["token_range"] = (cfg["token_range"][0], min(cfg["token_range"][1], hf_config["vocab_size"] - 1))
    base = {
        "model": cfg["model"],
        "dtype": cfg["dtype"],
        "device": device,
        "num_requests": cfg["num_requests"],
        "prompt_range": cfg["prompt_range"],
        "output_range": cfg["output_range"],
        "token_range": cfg["token_range"],
        "seed": a.seed,
        "max_num_seqs": cfg["max_num_seqs"],
        "max_num_batched_tokens": cfg["max_num_batched_tokens"],
        "max_model_len": cfg["prompt_range"][1] + cfg["output_range"][1],
        "time_limit_s": a.time_limit,
    }
    threads, thread_timings = (a.threads, {}) if a.threads or device == "cuda" else pick_threads()
    if device == "cuda":
        threads = a.threads  # None: torch's default on the GPU machine
    base["threads"] = threads
    if threads:
        torch.set_num_threads(threads)
    env = environment()
    env["threads_for_all_systems"] = threads
    env["thread_timings_s"] = thread_timings
    print(
        f"[bench] {preset_name}: {cfg['model']} {cfg['dtype']} on {env['device']}; {cfg['num_requests']} requests, "
        f"prompts {cfg['prompt_range']}, outputs {cfg['output_range']}; torch threads {threads}; "
        f"load {env['load_average']}",
        flush=True,
    )

    device_numbers = run_system(dict(base, system="device"), 600)

    def report(final: bool):
        rows = []
        order = {name: i for i, name in enumerate(SYSTEMS)}
        for _label, results in sorted(all_runs.items(), key=lambda kv: order[kv[0].split(" ")[0]]):
            done = [r for r in results if "output_tok_s" in r]
            best = max(done, key=lambda r: r["output_tok_s"]) if done else results[-1]
            rows.append(dict(best, runs_tok_s=[round(r.get("output_tok_s", 0.0), 2) for r in results]))

        prompts, outputs = make_workload(
            cfg["num_requests"], cfg["prompt_range"], cfg["output_range"], cfg["token_range"], a.seed
        )
        bound = None
        if "bandwidth_Bps" in device_numbers:
            dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[cfg["dtype"]]
            bound = workload_bound(
                prompts,
                outputs,
                model_numbers(hf_config, dtype_bytes),
                cfg["max_num_seqs"],
                device_numbers["bandwidth_Bps"],
                device_numbers["flops_per_s"],
            )
        ok = [r for r in rows if "output_tok_s" in r]
        best_static = max((r["output_tok_s"] for r in ok if r["system"].startswith("hf-static")), default=None)
        cb = next((r["output_tok_s"] for r in ok if r["system"] == "hf-cb"), None)
        table_rows = []
        for r in rows:
            if "output_tok_s" not in r:
                table_rows.append([r["system"], "-", "-", "-", "-", "-", r.get("error", "")])
                continue
            v = r["output_tok_s"]
            table_rows.append(
                [
                    r["system"],
                    v,
                    r["elapsed_s"],
                    f"{v / best_static:.2f}x" if best_static else "-",
                    f"{v / cb:.2f}x" if cb else "-",
                    f"{100 * v / bound['bound_output_tok_s']:.1f}%" if bound else "-",
                    r.get("note", "") + (f"; runs: {r['runs_tok_s']}" if len(r["runs_tok_s"]) > 1 else ""),
                ]
            )
        table = markdown_table(
            ["system", "output tok/s", "time (s)", "vs best hf-static", "vs hf-cb", "of roofline", "notes"], table_rows
        )
        env["load_average_after"] = load_average()
        lines = [
            f"# Throughput: {cfg['model']} ({cfg['dtype']}) on {env['device']}",
            "",
            f"Workload: {cfg['num_requests']} requests, random token ids, prompt lengths uniform in "
            f"{list(cfg['prompt_range'])}, output lengths uniform in {list(cfg['output_range'])}, EOS ignored, "
            f"greedy; {sum(len(p) for p in prompts)} prompt tokens, {sum(outputs)} output tokens (seed {a.seed}).",
            "",
            table,
            "",
        ]
        if bound:
            lines += [
                f"Roofline bound for this workload: {bound['bound_output_tok_s']:,.0f} output tok/s "
                f"(memory {bound['t_memory_s']:.2f} s: {bound['bytes'] / 1e9:.1f} GB over "
                f"{device_numbers['bandwidth_Bps'] / 1e9:.0f} GB/s measured ({device_numbers['copy']}); "
                f"compute {bound['t_compute_s']:.2f} s: {bound['flops'] / 1e12:.1f} TFLOP over "
                f"{device_numbers['flops_per_s'] / 1e12:.2f} TFLOP/s measured ({device_numbers['matmul']})). "
                f"Memory: weights once per forward, >= {bound['min_forwards']} forwards (longest output, or "
                f"outputs / max_num_seqs={cfg['max_num_seqs']}), plus each decode token's context KV.",
                "",
            ]
        lines += [
            f"- device: {env['device']}; cpu: {env['cpu']} ({env['cpu_count']} cores, torch threads "
            f"{env['torch_threads']})",
            f"- versions: python {env['python']}, torch {env['torch']}, triton {env['triton']}, "
            f"transformers {env['transformers']}, cuda {env['cuda']}",
            f"- date: {env['date']}; git {env['git']}; command: `{env['command']}`",
            f"- load average (1/5/15 min) at start: {env['load_average']}; at end: {env['load_average_after']}; "
            f"per system in the JSON (the CPU machine is shared with other engineers' test runs)",
            f"- torch threads for every system: {threads}"
            + (f" (picked by timing 1 vs all cores: {thread_timings})" if thread_timings else ""),
            f"- {a.repeats} interleaved run(s) per system (order reversed on every other round); the table shows "
            f"each system's best run",
            "- each system runs in its own process after a warm-up; time = submitting all requests to the "
            "last token (hf-static: all batches back to back)",
        ]
        text = "\n".join(lines) + "\n"
        name = a.name or f"{preset_name}-{cfg['model']}"
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"{name}.md").write_text(text)
        write_json(
            a.out / f"{name}.json",
            {
                "env": env,
                "config": cfg,
                "device_measured": device_numbers,
                "roofline": bound,
                "results": rows,
                "all_runs": all_runs,
            },
        )
        if final:
            print("\n" + text)
            print(f"wrote {a.out / (name + '.md')}")
        return ok

    runs = [
        (name, {"batch_size": b}) if name == "hf-static" else (name, {})  # in SYSTEMS order
        for name in SYSTEMS
        if name in cfg["systems"]
        for b in (cfg["hf_batch_sizes"] if name == "hf-static" else [None])
    ]
    all_runs: dict[str, list] = {}
    system_timeout = a.system_timeout or 2 * a.time_limit + 300
    for repeat in range(a.repeats):
        for system, extra in runs if repeat % 2 == 0 else runs[::-1]:  # alternate the order
            label = system + (f" (batch {extra['batch_size']})" if "batch_size" in extra else "")
            print(f"[bench] {label} (run {repeat + 1}/{a.repeats}) ...", flush=True)
            if system == "engine-triton" and device != "cuda":
                res = {
                    "error": "skipped: Triton on CPU runs only in the interpreter (seconds per layer per "
                    "step); tests/test_triton_e2e.py checks its tokens"
                }
            else:
                res = run_system(dict(base, system=system, **extra), system_timeout)
            if "elapsed_s" in res:
                res["output_tok_s"] = res["output_tokens"] / res["elapsed_s"]
                print(
                    f"[bench]   {res['output_tok_s']:.1f} output tok/s ({res['elapsed_s']:.1f} s; load before "
                    f"{res.get('load_before')})",
                    flush=True,
                )
            else:
                print(f"[bench]   {res.get('error')}", flush=True)
            all_runs.setdefault(label, []).append(dict(res, system=label, run=repeat + 1))
            report(final=False)  # partial results survive an interrupted run
    ok = report(final=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
