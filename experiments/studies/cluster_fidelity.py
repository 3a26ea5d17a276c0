"""Sim vs real for a 2-replica cluster on this CPU, under each router: the same trace replayed through two
real engine processes (experiments.cluster.processes) and through two simulated engines priced by a
profile of the same engine (executor.cost_model=profile), and the relative error of the simulation's
output throughput, median and p90 TTFT, median TPOT and median E2EL (the targets of the simulator's
fidelity study, results/fidelity/), plus how each router split the requests in both.

    python -m experiments.studies.cluster_fidelity --profile results/profiles/<profile>.json \\
        model=smollm2-135m kernel=cpu                                   # -> results/cluster/fidelity*
    python -m experiments.studies.cluster_fidelity --profile P.json --requests 20 model=tiny   # a quick look

Arguments other than the flags are Hydra overrides for both runs (the model and kernel the profile was
measured on). Held fixed: the workload (the Azure conversation sample, open loop, lengths scaled down to
CPU size as in experiments.studies.fidelity), 2 replicas, the engine config, one torch thread per replica.
What differs by construction: a real router sees a replica's load as of its last step report and its
prefix cache only through the prompts it routed there; a simulated router reads both from the engine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.results.environment import environment, load_average
from experiments.studies.cluster_runs import ROOT, run_cluster_quietly

OUT = ROOT / "results" / "cluster"
ROUTERS = ["round_robin", "random", "least_outstanding", "least_kv", "power_of_two", "prefix_affinity"]
METRICS = ("output_throughput", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "median_e2el_ms")


def workload(requests: int, time_scale: float) -> list[str]:
    return [
        "trace=azure",
        f"trace.max_requests={requests}",
        f"trace.time_scale={time_scale}",
        "replay=open_loop",
        "replay.length_scale=0.0625",
        "replay.max_prompt_tokens=256",
        "replay.max_output_tokens=48",
        "cluster.replicas=2",
        "cluster.threads_per_replica=1",
    ]


def relative(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def plot(frame: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.8))
    for ax, metric in zip(axes, METRICS):
        part = frame[frame["metric"] == metric]
        x = range(len(part))
        ax.bar([i - 0.2 for i in x], part["real"], 0.4, label="real (2 processes)")
        ax.bar([i + 0.2 for i in x], part["sim"], 0.4, label="SIMULATED (profile)")
        ax.set_xticks(list(x), part["router"], rotation=45, ha="right", fontsize=7)
        ax.set_title(metric, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, required=True, help="a profile of the same model, kernel and dtype")
    p.add_argument("--requests", type=int, default=80)
    p.add_argument("--time-scale", type=float, default=0.5, help="arrival speed-up of the Azure sample")
    p.add_argument("--routers", nargs="+", default=ROUTERS)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--name", default="fidelity", help="file stem of the outputs")
    args, overrides = p.parse_known_args(argv)
    rows, splits = [], []
    common = [*overrides, *workload(args.requests, args.time_scale)]
    loads = []
    for router in args.routers:
        loads.append(load_average())
        started = time.perf_counter()
        real = run_cluster_quietly([*common, "executor=real", f"cluster.router={router}"])
        sim = run_cluster_quietly(
            [
                *common,
                "executor=sim",
                "executor.cost_model=profile",
                f"executor.profile={args.profile}",
                f"cluster.router={router}",
            ]  # fmt: skip
        )
        for metric in METRICS:
            rows.append({"router": router, "metric": metric, "real": real[metric], "sim": sim[metric],
                         "relative_error": relative(sim[metric], real[metric])})  # fmt: skip
        splits.append({"router": router, "real_replica_requests": real["replica_requests"],
                       "sim_replica_requests": sim["replica_requests"], "real_completed": real["completed"],
                       "sim_completed": sim["completed"], "wall_s": time.perf_counter() - started})  # fmt: skip
        print(f"{router}: " + ", ".join(f"{r['metric']} {r['relative_error']:+.0%}" for r in rows[-len(METRICS) :]),
              flush=True)  # fmt: skip
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / f"{args.name}.csv", index=False)
    pd.DataFrame(splits).to_csv(args.out / f"{args.name}_splits.csv", index=False)
    env = environment()
    (args.out / f"{args.name}_env.txt").write_text(
        f"command: python -m experiments.studies.cluster_fidelity {' '.join(sys.argv[1:] if argv is None else argv)}\n"
        f"profile: {args.profile}\nmachine: {env['cpu']}, {env['cpu_count']} cores; date {env['date']}; "
        f"git {env['git']}\nload average before each router's pair: {loads}\n"
    )
    plot(frame, args.out / f"{args.name}.png", f"2-replica cluster, real vs SIMULATED ({' '.join(overrides)})")


if __name__ == "__main__":
    main()
