"""How fast the simulator runs: simulated requests per wall-clock second, and where the time goes.

    python -m benchmarks.sim_speed                                   # 10,000 Azure requests, llama-3.1-8b, h100-sxm
    python -m benchmarks.sim_speed --requests 2000 --trace-path experiments/data/azure_llm_2023_conv_sample.csv

Replays the Azure conversation trace (the full one from --trace-path; the shipped sample has 1,000 rows)
open loop at its own arrival times through the simulated executor with the roofline cost model, through
the same runner as `run.py` (recorder, metrics, result files), then profiles a second, shorter run with
cProfile to name what dominates. Writes results/sim_speed/sim_speed.{json,md}.
"""

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import FULL_AZURE, environment, markdown_table, write_json
from experiments.results.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def overrides(args, requests: int) -> list[str]:
    return [
        "progress=false",
        "wandb.enabled=false",
        f"model={args.model}",
        "executor=sim",
        f"device={args.device}",
        "trace=azure",
        f"trace.path={args.trace_path}",
        f"trace.max_requests={requests}",
        "replay=open_loop",
        f"scheduler.max_num_seqs={args.max_num_seqs}",
        f"scheduler.max_num_batched_tokens={args.budget}",
        f"executor.skip_steps={str(args.skip_steps).lower()}",
        f"metrics.kv_access_log={str(args.kv_access_log).lower()}",
    ]


def run(args, requests: int, out: Path) -> tuple[dict, float, float]:
    from hydra import compose, initialize_config_module

    from experiments.run.runner import run_trace

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides(args, requests))
    start, cpu = time.perf_counter(), time.process_time()
    summary = run_trace(cfg, out)
    return summary, time.perf_counter() - start, time.process_time() - cpu


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument(
        "--trace-path",
        default=str(FULL_AZURE) if FULL_AZURE.exists() else "experiments/data/azure_llm_2023_conv_sample.csv",
    )
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--device", default="h100-sxm")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--profile-requests", type=int, default=1000)
    p.add_argument(
        "--skip-steps",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=True,
        help="executor.skip_steps (true: decode steps between events in one go; false: one by one)",
    )
    p.add_argument(
        "--kv-access-log",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=True,
        help="metrics.kv_access_log (true, the default run's: kv_accesses.parquet is recorded and written)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "results" / "sim_speed")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        summary, wall, cpu = run(args, args.requests, Path(tmp) / "run")
        profiler = cProfile.Profile()
        profiler.enable()
        run(args, args.profile_requests, Path(tmp) / "profiled")
        profiler.disable()
    stats = io.StringIO()
    pstats.Stats(profiler, stream=stats).sort_stats("tottime").print_stats(15)
    result = {
        "requests": summary["completed"],
        "wall_s": wall,
        "process_cpu_s": cpu,  # this process's CPU time over the run: less sensitive to other load than wall
        "simulated_s": summary["duration"],
        "steps": summary.get("sim_steps"),
        "requests_per_wall_s": summary["completed"] / wall,
        "steps_per_wall_s": (summary.get("sim_steps") or 0) / wall,
        "simulated_per_wall": summary["duration"] / wall,
        "summary": {k: summary[k] for k in ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_ttft_ms")},
        "args": vars(args) | {"out": str(args.out)},
        "environment": environment(),
        "profile_top_tottime": stats.getvalue(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "sim_speed.json", result)
    table = markdown_table(
        ["requests", "wall (s)", "process CPU (s)", "simulated (s)", "steps", "requests / wall s", "steps / wall s"],
        [
            [
                result["requests"],
                wall,
                cpu,
                summary["duration"],
                result["steps"],
                result["requests_per_wall_s"],
                result["steps_per_wall_s"],
            ]
        ],
    )
    atomic_write_text(
        args.out / "sim_speed.md",
        f"# Simulator speed\n\n{table}\n\nWorkload: {args.requests} Azure conversation requests ({args.trace_path}), "
        f"open loop at trace speed, {args.model} on the {args.device} roofline model, max_num_seqs "
        f"{args.max_num_seqs}, budget {args.budget}, executor.skip_steps={str(args.skip_steps).lower()}, "
        f"metrics.kv_access_log={str(args.kv_access_log).lower()}. "
        f"Machine: {result['environment']['cpu']}, "
        f"{result['environment']['cpu_count']} cores, load {result['environment']['load_average']}, "
        f"{result['environment']['date']}, git {result['environment']['git']}.\n\n"
        f"Where the time goes (cProfile, {args.profile_requests} requests, top functions by own time):\n\n"
        f"```\n{stats.getvalue()[:6000]}\n```\n",
    )
    print(table, file=sys.stderr)


if __name__ == "__main__":
    main()
