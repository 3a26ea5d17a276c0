"""Minor page faults and time of a CPU run with and without keep_freed_memory (testbed/executor/host_memory.py).

The cpu-shape workload of benchmarks.throughput (N sequences of random prompt tokens submitted together, EOS
ignored, greedy, kernel=cpu, prefix caching off), each mode in a fresh process after a warm-up, modes
interleaved; "default" stubs keep_freed_memory out before the engine is built, leaving glibc's own settings.

    python -m benchmarks.page_faults                  # N = 32, PP 256, TG 64, 2 repeats -> results/host_overhead/
    python -m benchmarks.page_faults --parallel 8 --repeats 3 --out /tmp/pf
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.systems import make_workload

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "host_overhead"
MODES = ("kept", "default")


def run_once(
    mode: str, model: str, parallel: int, prompt_len: int, output_len: int, threads: int, kv_cache_memory_gb: float
) -> dict:
    """One mode in this process: the timed run's minor faults and seconds."""
    import torch

    import testbed.executor.build as build
    from testbed import Engine, EngineConfig, SamplingParams
    from testbed.models.registry import resolve_model

    torch.set_num_threads(threads)
    if mode == "default":
        build.keep_freed_memory = lambda: False
    vocab = resolve_model(model).hf_config["vocab_size"]
    prompts, outputs = make_workload(parallel, (prompt_len,) * 2, (output_len,) * 2, (0, min(10000, vocab - 1)))
    engine = Engine(
        EngineConfig(
            model=model,
            kernel="cpu",
            dtype="float32",
            max_num_seqs=parallel,
            max_num_batched_tokens=512,
            max_model_len=prompt_len + output_len,
            enable_prefix_caching=False,
            kv_cache_memory_gb=kv_cache_memory_gb,
        )
    )
    for i, (p, o) in enumerate([(prompts[0][:64], 4), (prompts[-1][:64], 4)]):  # warm-up
        engine.add_request(f"warm{i}", p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return {
        "mode": mode,
        "seconds": time.perf_counter() - start,
        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--parallel", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--kv-cache-memory-gb",
        type=float,
        default=1.0,
        help="the engine's KV cache budget (GiB), allocated and faulted in before the timed run",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    shape = (a.model, a.parallel, a.prompt_len, a.output_len, a.threads, a.kv_cache_memory_gb)
    if a.child:
        print(json.dumps(run_once(a.child, *shape)))
        return 0
    # here, not at the top: a child (one per mode per round) would import pandas with it for nothing
    from benchmarks.common import environment, load_average, markdown_table, publish

    env, runs = {**environment(), "load_before": load_average()}, []
    for r in range(a.repeats):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            print(f"[page_faults] {mode} (run {r + 1}/{a.repeats}) ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, "-m", "benchmarks.page_faults", "--child", mode, "--model", a.model]
            cmd += ["--parallel", str(a.parallel)]
            cmd += ["--prompt-len", str(a.prompt_len), "--output-len", str(a.output_len), "--threads", str(a.threads)]
            cmd += ["--kv-cache-memory-gb", str(a.kv_cache_memory_gb)]
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"page_faults: the {mode} run failed:\n{out.stderr[-3000:]}")
            runs.append({**json.loads(out.stdout.splitlines()[-1]), "run": r + 1, "load": load_average()})
            print(f"[page_faults]   {runs[-1]['minor_faults']} faults, {runs[-1]['seconds']:.2f} s", file=sys.stderr)
    env["load_after"] = load_average()
    by_mode = {m: [x for x in runs if x["mode"] == m] for m in MODES}
    rows = [[m, [x["minor_faults"] for x in rs], [round(x["seconds"], 2) for x in rs]] for m, rs in by_mode.items()]
    workload = f"{a.parallel} sequences x {a.prompt_len} prompt + {a.output_len} output tokens"
    md = (
        f"# Minor page faults of a CPU run, freed memory kept vs glibc's defaults\n\n"
        f"{a.model} fp32, kernel=cpu, {workload}, {a.threads} threads, prefix caching off; every run in a "
        f"fresh process after a warm-up, modes interleaved (order reversed every other round).\n\n"
        + markdown_table(["mode", "minor faults (runs)", "seconds (runs)"], rows)
        + f"\n\n- cpu: {env['cpu']} ({env['cpu_count']} cores); date {env['date']}; git {env['git']}\n"
    )
    publish(a.out, "page_faults", md, env, {"config": vars(a) | {"out": str(a.out)}, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
