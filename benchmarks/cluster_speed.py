"""How fast a simulated cluster runs: simulated requests per wall-clock second, and where the time goes.

    python -m benchmarks.cluster_speed                       # 16 replicas, the full Azure conversation trace
    python -m benchmarks.cluster_speed --requests 2000 --replicas 4
    python -m benchmarks.cluster_speed --router round_robin   # routed ahead: each replica to its next arrival

Replays the Azure conversation trace (the full one, 19,366 rows, from --trace-path when it exists, else
the shipped 1,000-row sample) open loop with arrivals sped up --time-scale times (default: as many as
there are replicas, so each replica sees about the trace's own rate), through N simulated engines
(llama-3.1-8b on the h100-sxm roofline model) behind a router, via the same runner as `run.py` (recorder,
metrics, result files). Then profiles a shorter run with cProfile to name what dominates.
Writes results/cluster/speed.{json,md} (speed-ROUTER.{json,md} for a router other than least_outstanding).
"""

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import FULL_AZURE, environment, load_average, markdown_table, write_json
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
        f"trace.time_scale={args.time_scale or args.replicas}",
        "replay=open_loop",
        f"scheduler.max_num_seqs={args.max_num_seqs}",
        f"scheduler.max_num_batched_tokens={args.budget}",
        f"cluster.replicas={args.replicas}",
        f"cluster.router={args.router}",
        f"executor.skip_steps={str(args.skip_steps).lower()}",
    ]


def run(args, requests: int, out: Path) -> tuple[dict, float, float]:
    """(summary, wall seconds, this process's CPU seconds) of one run."""
    from hydra import compose, initialize_config_module

    from experiments.cluster.runner import run_cluster

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides(args, requests))
    start, cpu = time.perf_counter(), time.process_time()
    summary = run_cluster(cfg, out)
    return summary, time.perf_counter() - start, time.process_time() - cpu


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20_000, help="at most this many (the full trace has 19,366)")
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--router", default="least_outstanding")
    p.add_argument("--time-scale", type=float, default=None, help="arrival speed-up (default: --replicas)")
    p.add_argument(
        "--trace-path",
        default=str(FULL_AZURE) if FULL_AZURE.exists() else "experiments/data/azure_llm_2023_conv_sample.csv",
    )
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--device", default="h100-sxm")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--profile-requests", type=int, default=2000)
    p.add_argument(
        "--skip-steps",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=True,
        help="executor.skip_steps (true: decode steps between events in one go; false: one by one)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "results" / "cluster")
    args = p.parse_args(argv)
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        summary, wall, cpu = run(args, args.requests, Path(tmp) / "run")
        load_after = load_average()
        profiler = cProfile.Profile()
        profiler.enable()
        run(args, args.profile_requests, Path(tmp) / "profiled")
        profiler.disable()
    stats = io.StringIO()
    pstats.Stats(profiler, stream=stats).sort_stats("tottime").print_stats(15)
    steps = summary.get("sim_steps") or 0
    result = {
        "requests": summary["completed"],
        "replicas": args.replicas,
        "wall_s": wall,
        "cpu_s": cpu,  # this process's CPU time: on a shared machine, less inflated by the others than wall
        "simulated_s": summary["duration"],
        "steps": steps,
        "requests_per_wall_s": summary["completed"] / wall,
        "steps_per_wall_s": steps / wall,
        "simulated_per_wall": summary["duration"] / wall,
        "load_before": load_before,
        "load_after": load_after,
        "summary": {
            k: summary[k]
            for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "replica_request_cv")
        },
        "args": vars(args) | {"out": str(args.out)},
        "environment": environment(),
        "profile_top_tottime": stats.getvalue(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "speed" if args.router == "least_outstanding" else f"speed-{args.router}"
    write_json(args.out / f"{stem}.json", result)
    table = markdown_table(
        ["replicas", "router", "requests", "wall (s)", "CPU (s)", "simulated (s)", "steps", "requests / wall s",
         "steps / wall s"],
        [[args.replicas, args.router, result["requests"], wall, cpu, summary["duration"], steps,
          result["requests_per_wall_s"], result["steps_per_wall_s"]]],
    )  # fmt: skip
    env = result["environment"]
    atomic_write_text(
        args.out / f"{stem}.md",
        f"# Simulated cluster speed (SIMULATED: {args.model} on the {args.device} roofline model)\n\n{table}\n\n"
        f"Workload: {result['requests']} Azure conversation requests ({args.trace_path}), open loop, arrivals "
        f"x{args.time_scale or args.replicas}, {args.replicas} replicas behind {args.router}, max_num_seqs "
        f"{args.max_num_seqs}, budget {args.budget}, executor.skip_steps={str(args.skip_steps).lower()}. "
        f"Machine: {env['cpu']}, {env['cpu_count']} cores, load "
        f"{load_before} before / {load_after} after the timed run (other agents' jobs share it), {env['date']}, "
        f"git {env['git']}.\n\nCommand: `python -m benchmarks.cluster_speed "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
        f"Where the time goes (cProfile, {args.profile_requests} requests, top functions by own time):\n\n"
        f"```\n{stats.getvalue()[:6000]}\n```\n",
    )
    print(table, file=sys.stderr)


if __name__ == "__main__":
    main()
