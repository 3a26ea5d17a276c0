"""Router shootout (SIMULATED): goodput and p99 TTFT of each router on Mooncake and Azure, 4/8/16 replicas
of llama-3.1-8b on the h100-sxm roofline model.

    python -m experiments.studies.cluster_routers                 # -> results/cluster/routers*.csv, routers.png
    python -m experiments.studies.cluster_routers --replicas 4 --windows 1 --requests 200   # a quick look

Held fixed: the engine (fcfs, chunked prefill, max_num_batched_tokens 8192, max_num_seqs 256, block 16,
prefix caching, bf16 KV), the cost model, the SLOs per trace and the load per replica: arrivals are sped
up in proportion to the replica count (time_scale = per-replica scale x replicas / 4), so every cluster
size sees the same offered load per replica. Repeats: disjoint windows of each trace (3 x 1,000 Azure
requests, 2 x 600 Mooncake ones; the routers' random draws are seeded by the window), reported as mean and
95% t interval over windows: workload variation, not only the routers' own randomness.
Runs already in the CSV are skipped, so a stopped study resumes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TypedDict

from experiments.studies.cluster_runs import ROOT, RunTable, run_cluster_quietly, summarize_repeats, trace_path

OUT = ROOT / "results" / "cluster"
ROUTERS = {  # label -> cluster overrides
    "round_robin": ["cluster.router=round_robin"],
    "random": ["cluster.router=random"],
    "least_outstanding": ["cluster.router=least_outstanding"],
    "least_kv": ["cluster.router=least_kv"],
    "power_of_two": ["cluster.router=power_of_two"],
    "prefix_affinity": ["cluster.router=prefix_affinity"],
    "prefix_affinity (ring only)": ["cluster.router=prefix_affinity", "cluster.router_options={cache_aware:false}"],
}
# per trace: SLOs (ms), arrival speed-up for 4 replicas, window starts (rows) and length
# (Mooncake: its last 1,200 rows, where its hash ids repeat most within a window; scale4 puts the 4-replica
# least_outstanding (Azure) / prefix_affinity (Mooncake) cluster near its SLO knee, from calibration runs)


class TraceSettings(TypedDict):
    ttft_ms: int  # SLOs
    tpot_ms: int
    scale4: float  # trace.time_scale at 4 replicas (scaled with the replica count)
    starts: list[int]  # trace.start of each window
    requests: int  # per window


TRACES: dict[str, TraceSettings] = {
    "azure": {"ttft_ms": 500, "tpot_ms": 50, "scale4": 24.0, "starts": [0, 6000, 12000], "requests": 1000},
    "mooncake": {"ttft_ms": 2000, "tpot_ms": 100, "scale4": 1.0, "starts": [2393, 3393], "requests": 600},
}
ENGINE = [
    "model=llama-3.1-8b",
    "executor=sim",
    "device=h100-sxm",
    "scheduler=fcfs",
    "scheduler.max_num_batched_tokens=8192",
    "scheduler.max_num_seqs=256",
    "cache.block_size=16",
    "replay=open_loop",
]
METRICS = [
    "request_goodput",
    "slo_attainment",
    "p99_ttft_ms",
    "median_ttft_ms",
    "median_tpot_ms",
    "output_throughput",
    "cluster_prefix_hit_rate",
    "replica_request_cv",
    "replica_token_cv",
]


def overrides(trace: str, replicas: int, router: str, window: int, requests: int | None = None) -> list[str]:
    t = TRACES[trace]
    return [
        *ENGINE,
        f"trace={trace}",
        f"trace.path={trace_path(trace)}",
        f"trace.start={t['starts'][window]}",
        f"trace.max_requests={requests or t['requests']}",
        f"trace.time_scale={t['scale4'] * replicas / 4}",
        f"slo.ttft_ms={t['ttft_ms']}",
        f"slo.tpot_ms={t['tpot_ms']}",
        f"seed={window}",
        f"cluster.replicas={replicas}",
        *ROUTERS[router],
    ]


def plot(summary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(summary["trace"]))
    fig, axes = plt.subplots(len(traces), 2, figsize=(13, 4.2 * len(traces)), squeeze=False)
    routers = list(ROUTERS)
    for row, trace in enumerate(traces):
        part = summary[summary["trace"] == trace]
        sizes = sorted(set(part["replicas"]))
        panels = [("request_goodput", "goodput (req/s)"), ("p99_ttft_ms", "p99 TTFT (ms)")]
        for col, (metric, label) in enumerate(panels):
            ax = axes[row][col]
            width = 0.8 / len(routers)
            for i, router in enumerate(routers):
                r = part[part["router"] == router].set_index("replicas").reindex(sizes)
                x = [j + i * width for j in range(len(sizes))]
                ax.bar(x, r[metric], width, yerr=r[f"{metric}_ci95"].fillna(0), label=router, capsize=2)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"{n} replicas" for n in sizes])
            ax.set_title(f"{trace}: {label} (SIMULATED, llama-3.1-8b, h100-sxm roofline)", fontsize=9)
            if metric == "p99_ttft_ms":
                ax.set_yscale("log")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="+", default=list(TRACES))
    p.add_argument("--replicas", nargs="+", type=int, default=[4, 8, 16])
    p.add_argument("--routers", nargs="+", default=list(ROUTERS))
    p.add_argument("--windows", type=int, default=None, help="at most this many windows per trace")
    p.add_argument("--requests", type=int, default=None, help="per window (default: per trace)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    table = RunTable(args.out / "routers_runs.csv", ["trace", "replicas", "router", "window"])
    for trace in args.traces:
        for replicas in args.replicas:
            for window in range(min(args.windows or 99, len(TRACES[trace]["starts"]))):
                for router in args.routers:
                    key = {"trace": trace, "replicas": replicas, "router": router, "window": window}
                    if table.done(key):
                        continue
                    started = time.perf_counter()
                    s = run_cluster_quietly(overrides(trace, replicas, router, window, args.requests))
                    row = {**key, "requests": s["num_requests"], "completed": s["completed"]}
                    row.update({m: s[m] for m in METRICS})
                    row.update(time_scale=TRACES[trace]["scale4"] * replicas / 4, wall_s=time.perf_counter() - started)
                    table.add(row)
                    print(f"{trace} n={replicas} w={window} {router}: goodput {s['request_goodput']:.2f} "
                          f"p99 TTFT {s['p99_ttft_ms']:.0f} ms hits {s['cluster_prefix_hit_rate']:.2f} "
                          f"({row['wall_s']:.0f} s)", flush=True)  # fmt: skip
    summary = summarize_repeats(table.frame(), ["trace", "replicas", "router"], METRICS)
    summary.to_csv(args.out / "routers.csv", index=False)
    plot(summary, args.out / "routers.png")


if __name__ == "__main__":
    main()
