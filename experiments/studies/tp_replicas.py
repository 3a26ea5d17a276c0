"""TP or replicas (SIMULATED): llama-3.1-70b on 8 H100s as TP=8 x 1 replica, TP=4 x 2 and TP=2 x 4, on the Azure
conversation trace; goodput, SLO attainment, TTFT and TPOT with 95% intervals over disjoint trace windows.

    python -m experiments.studies.tp_replicas                      # -> results/tp/tp_replicas*.csv, .png
    python -m experiments.studies.tp_replicas --windows 1 --requests 200 --scales 8   # a quick look

Every replica is priced by the h100-sxm roofline for one rank's share of the model plus two ring all-reduces per
layer, one after the embedding and a logits gather over NVLink (testbed/parallel/sim_cost.py); its KV capacity is
what one rank's 80 GB holds after its share of the weights (gpu_memory_utilization 0.9), (every rank holds the same
blocks' share of heads). The router is least_outstanding. Held fixed: the engine (fcfs, chunked prefill,
max_num_batched_tokens 8192, max_num_seqs 256, block 16, prefix caching), SLOs (TTFT 2 s, TPOT 100 ms), the offered
load per run (time_scale: arrivals sped up that many times). Repeats: 3 disjoint windows of 1,000 requests (workload
variation), mean and 95% t interval. Runs already in the CSV are skipped.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from experiments.studies.cluster_runs import (
    ROOT,
    RunTable,
    ci95,
    run_cluster_quietly,
    summarize_repeats,
    trace_path,
)

OUT = ROOT / "results" / "tp"
LAYOUTS = {"TP=8 x 1": (8, 1), "TP=4 x 2": (4, 2), "TP=2 x 4": (2, 4)}  # label -> (TP size, replicas)
STARTS = [0, 6000, 12000]  # window starts (rows of the full trace)
SLO = {"ttft_ms": 2000, "tpot_ms": 100}
ENGINE = [
    "model=llama-3.1-70b",
    "executor=sim",
    "device=h100-sxm",
    "scheduler=fcfs",
    "scheduler.max_num_batched_tokens=8192",
    "scheduler.max_num_seqs=256",
    "cache.block_size=16",
    "replay=open_loop",
    "cluster.router=least_outstanding",
]
METRICS = [
    "request_goodput",
    "slo_attainment",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "output_throughput",
]


def overrides(layout: str, scale: float, window: int, requests: int) -> list[str]:
    tp, replicas = LAYOUTS[layout]
    return [
        *ENGINE,
        "trace=azure",
        f"trace.path={trace_path('azure')}",
        f"trace.start={STARTS[window]}",
        f"trace.max_requests={requests}",
        f"trace.time_scale={scale}",
        f"slo.ttft_ms={SLO['ttft_ms']}",
        f"slo.tpot_ms={SLO['tpot_ms']}",
        f"seed={window}",
        f"parallel.tensor_parallel_size={tp}",
        f"cluster.replicas={replicas}",
    ]


def paired(frame):
    """Each layout against TP=8 x 1 on the same window and load: goodput ratio and SLO-attainment difference,
    mean and 95% t interval over windows (the windows' own load differences cancel)."""
    import pandas as pd

    base = frame[frame["layout"] == "TP=8 x 1"].set_index(["time_scale", "window"])
    rows = []
    for (layout, scale), group in frame[frame["layout"] != "TP=8 x 1"].groupby(["layout", "time_scale"]):
        ref = base.loc[[(scale, w) for w in group["window"]]]
        ratio = group["request_goodput"].to_numpy() / ref["request_goodput"].to_numpy()
        diff = group["slo_attainment"].to_numpy() - ref["slo_attainment"].to_numpy()
        (g, g_ci), (d, d_ci) = ci95(ratio), ci95(diff)
        rows.append({"layout": layout, "time_scale": scale, "windows": len(group), "goodput_ratio": g,
                     "goodput_ratio_ci95": g_ci, "slo_diff": d, "slo_diff_ci95": d_ci})  # fmt: skip
    return pd.DataFrame(rows)


def plot(summary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("request_goodput", "goodput (req/s)"), ("median_ttft_ms", "median TTFT (ms)"),
              ("median_tpot_ms", "median TPOT (ms)")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
    for ax, (metric, label) in zip(axes, panels):
        for layout in LAYOUTS:
            part = summary[summary["layout"] == layout].sort_values("time_scale")
            ax.errorbar(part["time_scale"], part[metric], yerr=part[f"{metric}_ci95"].fillna(0), label=layout,
                        marker="o", capsize=3)  # fmt: skip
        ax.set_xlabel("arrival speed-up (time_scale)")
        ax.set_title(f"{label} (SIMULATED: llama-3.1-70b, 8 x h100-sxm roofline)", fontsize=9)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS))
    p.add_argument("--scales", nargs="+", type=float, default=[1.0, 2.0, 4.0, 8.0])
    p.add_argument("--windows", type=int, default=len(STARTS))
    p.add_argument("--requests", type=int, default=1000, help="per window")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    table = RunTable(args.out / "tp_replicas_runs.csv", ["layout", "time_scale", "window", "requests"])
    for scale in args.scales:
        for window in range(min(args.windows, len(STARTS))):
            for layout in args.layouts:
                key = {"layout": layout, "time_scale": scale, "window": window, "requests": args.requests}
                if table.done(key):
                    continue
                started = time.perf_counter()
                s = run_cluster_quietly(overrides(layout, scale, window, args.requests))
                row = {**key, "completed": s["completed"], **{m: s[m] for m in METRICS}}
                row.update(wall_s=time.perf_counter() - started)
                table.add(row)
                print(f"x{scale:g} w={window} {layout}: goodput {s['request_goodput']:.2f} req/s, "
                      f"SLO {s['slo_attainment']:.0%}, median TTFT {s['median_ttft_ms']:.0f} ms, "
                      f"TPOT {s['median_tpot_ms']:.1f} ms ({row['wall_s']:.0f} s)", flush=True)  # fmt: skip
    summary = summarize_repeats(table.frame(), ["layout", "time_scale"], METRICS)
    summary.to_csv(args.out / "tp_replicas.csv", index=False)
    paired(table.frame()).to_csv(args.out / "tp_replicas_paired.csv", index=False)
    plot(summary, args.out / "tp_replicas.png")


if __name__ == "__main__":
    main()
