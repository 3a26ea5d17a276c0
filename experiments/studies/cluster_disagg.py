"""Disaggregated vs colocated (SIMULATED), DistServe-style: at an equal replica count, the highest request
rate each configuration serves with >= 90% of requests meeting both SLOs (goodput), on a prompt-heavy and
an output-heavy workload; then the KV link's bandwidth swept for a disaggregated configuration.

    python -m experiments.studies.cluster_disagg            # -> results/cluster/disagg*.csv, disagg.png
    python -m experiments.studies.cluster_disagg --seeds 1 --requests 200   # a quick look

Held fixed: 4 replicas of llama-3.1-8b on the h100-sxm roofline model, the engine (fcfs, chunked prefill,
max_num_batched_tokens 8192, max_num_seqs 256, block 16, prefix caching), Poisson arrivals, the workload's
length distributions and SLOs; colocated replicas behind least_outstanding; P/D: prefill replicas behind
least_outstanding, decode replicas chosen by least_outstanding, KV over ib-400g unless swept (the sweep
uses the best disaggregated configuration on the prompt-heavy workload, where the most bytes move).
Goodput (DistServe, OSDI'24): for each seed, SLO attainment is measured at every rate of the sweep and the
rate where it falls to 90% is interpolated linearly between the two sweep points around it (the highest
rate if it never does, 0 if the lowest already misses); mean and 95% t interval over seeds (seeds change
arrivals and lengths).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd

from experiments.studies.cluster_runs import ROOT, RunTable, ci95, run_cluster_quietly

OUT = ROOT / "results" / "cluster"
GOAL = 0.9


class WorkloadSettings(TypedDict):
    prompt: tuple[int, int]  # uniform length range, tokens
    output: tuple[int, int]
    ttft_ms: int  # SLOs
    tpot_ms: int
    rates: list[int]  # whole cluster, req/s
    requests: int


WORKLOADS: dict[str, WorkloadSettings] = {
    # prompt-heavy: summarisation-like; output-heavy: generation-like (lengths in tokens, uniform). Rates
    # (whole cluster, req/s) bracket each configuration's knee; enough requests that the cluster fills up
    "prompt-heavy": {"prompt": (2048, 6144), "output": (32, 128), "ttft_ms": 1500, "tpot_ms": 40,
                     "rates": [8, 16, 24, 32, 40, 48], "requests": 400},
    "output-heavy": {"prompt": (128, 512), "output": (512, 1536), "ttft_ms": 500, "tpot_ms": 40,
                     "rates": [32, 64, 96, 128, 160, 192], "requests": 1000},
}  # fmt: skip
CONFIGS = {  # label -> cluster overrides (4 replicas each)
    "colocated 4": ["cluster.replicas=4", "cluster.router=least_outstanding"],
    "1P+3D": ["cluster.prefill_replicas=1", "cluster.decode_replicas=3", "cluster.router=least_outstanding"],
    "2P+2D": ["cluster.prefill_replicas=2", "cluster.decode_replicas=2", "cluster.router=least_outstanding"],
    "3P+1D": ["cluster.prefill_replicas=3", "cluster.decode_replicas=1", "cluster.router=least_outstanding"],
}
LINKS = {  # label -> cluster.link (GB/s one way, us)
    "nvlink": "nvlink",
    "pcie-gen5": "pcie-gen5",
    "ib-400g": "ib-400g",
    "ethernet-100g": "ethernet-100g",
    "10 Gb/s": "{name:eth-10g,bandwidth_gbs:1.25,latency_us:10}",
    "1 Gb/s": "{name:eth-1g,bandwidth_gbs:0.125,latency_us:10}",
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
    "trace=synthetic",
]


def overrides(workload: str, config: str, rate: float, seed: int, requests: int, link: str = "ib-400g") -> list[str]:
    w = WORKLOADS[workload]
    return [
        *ENGINE,
        f"trace.num_requests={requests}",
        f"trace.rate={rate}",
        f"trace.seed={seed}",
        f"seed={seed}",
        f"trace.prompt_len={{dist:uniform,low:{w['prompt'][0]},high:{w['prompt'][1]}}}",
        f"trace.output_len={{dist:uniform,low:{w['output'][0]},high:{w['output'][1]}}}",
        f"slo.ttft_ms={w['ttft_ms']}",
        f"slo.tpot_ms={w['tpot_ms']}",
        *CONFIGS[config],
        f"cluster.link={link}",
    ]


def rate_at_goal(rates, attainment, goal: float = GOAL) -> float:
    """The rate where attainment falls to `goal`, linearly between sweep points (see the module doc)."""
    order = np.argsort(rates)
    r, a = np.asarray(rates, float)[order], np.asarray(attainment, float)[order]
    if a[0] < goal:
        return 0.0
    for i in range(1, len(r)):
        if a[i] < goal:
            return float(r[i - 1] + (a[i - 1] - goal) / (a[i - 1] - a[i]) * (r[i] - r[i - 1]))
    return float(r[-1])


def capacities(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    rows = []
    for key, group in runs.groupby(by, sort=False):
        per_seed = [rate_at_goal(g["rate"], g["slo_attainment"]) for _, g in group.groupby("seed")]
        mean, half = ci95(per_seed)
        saturated = all(g["slo_attainment"].min() >= GOAL for _, g in group.groupby("seed"))
        rows.append({**dict(zip(by, key)), "goodput_rps": mean, "goodput_rps_ci95": half,
                     "goodput_per_replica": mean / 4, "seeds": len(per_seed), "above_sweep": saturated})  # fmt: skip
    return pd.DataFrame(rows)


def plot(runs: pd.DataFrame, caps: pd.DataFrame, link_caps: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(runs["workload"]))
    fig, axes = plt.subplots(1, len(workloads) + 1, figsize=(5.2 * (len(workloads) + 1), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        part = runs[(runs["workload"] == workload) & (runs["link"] == "ib-400g")]
        for config, group in part.groupby("config", sort=False):
            mean = group.groupby("rate")["slo_attainment"].mean()
            ax.plot(mean.index, mean.values, marker="o", label=config)
        ax.axhline(GOAL, color="grey", lw=0.8, ls="--")
        w = WORKLOADS[workload]
        ax.set_title(f"{workload}: SLO attainment (TTFT<={w['ttft_ms']} ms, TPOT<={w['tpot_ms']} ms)\n"
                     "SIMULATED llama-3.1-8b x4, h100-sxm roofline", fontsize=8)  # fmt: skip
        ax.set_xlabel("request rate (req/s, whole cluster)")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    if len(link_caps):
        for config, group in link_caps.groupby("config", sort=False):
            group = group.sort_values("bandwidth_gbs")
            ax.errorbar(group["bandwidth_gbs"], group["goodput_rps"], yerr=group["goodput_rps_ci95"].fillna(0),
                        marker="o", capsize=2, label=f"{config} ({group['workload'].iloc[0]})")  # fmt: skip
        colocated = caps[(caps["config"] == "colocated 4") & (caps["workload"] == link_caps["workload"].iloc[0])]
        if len(colocated):
            ax.axhline(colocated["goodput_rps"].iloc[0], color="grey", ls="--", label="colocated 4")
        ax.set_xscale("log")
        ax.set_xlabel("KV link bandwidth (GB/s, one way)")
        ax.set_ylabel("goodput (req/s at 90% SLO attainment)")
        ax.set_title("goodput vs KV link bandwidth (SIMULATED)", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    p.add_argument("--configs", nargs="+", default=list(CONFIGS))
    p.add_argument("--rates", type=float, nargs="+", default=None, help="default: per workload")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--requests", type=int, default=None, help="default: per workload")
    p.add_argument("--link-workload", default="prompt-heavy")
    p.add_argument("--link-config", default=None, help="default: the best P/D config on --link-workload")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    table = RunTable(args.out / "disagg_runs.csv", ["workload", "config", "link", "rate", "seed"])

    def measure(workload, config, link_label, rate, seed):
        key = {"workload": workload, "config": config, "link": link_label, "rate": rate, "seed": seed}
        if table.done(key):
            return
        started = time.perf_counter()
        requests = args.requests or WORKLOADS[workload]["requests"]
        s = run_cluster_quietly(overrides(workload, config, rate, seed, requests, LINKS[link_label]))
        row = {**key, "completed": s["completed"], "slo_attainment": s["slo_attainment"],
               "request_goodput": s["request_goodput"], "p99_ttft_ms": s["p99_ttft_ms"],
               "median_ttft_ms": s["median_ttft_ms"], "median_tpot_ms": s["median_tpot_ms"],
               "p99_tpot_ms": s["p99_tpot_ms"], "mean_kv_transfer_ms": s.get("mean_kv_transfer_ms", math.nan),
               "mean_kv_transfer_wait_ms": s.get("mean_kv_transfer_wait_ms", math.nan),
               "bandwidth_gbs": s.get("cluster_link_bandwidth_gbs", math.nan),
               "wall_s": time.perf_counter() - started}  # fmt: skip
        table.add(row)
        print(f"{workload} {config} {link_label} rate={rate} seed={seed}: attainment {s['slo_attainment']:.2f} "
              f"({row['wall_s']:.0f} s)", flush=True)  # fmt: skip

    for workload in args.workloads:
        for seed in range(args.seeds):
            for config in args.configs:
                for rate in args.rates or WORKLOADS[workload]["rates"]:
                    measure(workload, config, "ib-400g", rate, seed)
    runs = table.frame()
    caps = capacities(runs[runs["link"] == "ib-400g"], ["workload", "config"])
    caps.to_csv(args.out / "disagg.csv", index=False)
    link_config = args.link_config
    if link_config is None:  # the best disaggregated configuration on that workload
        pd_caps = caps[(caps["workload"] == args.link_workload) & (caps["config"] != "colocated 4")]
        link_config = pd_caps.sort_values("goodput_rps")["config"].iloc[-1]
    for seed in range(args.seeds):
        for link_label in LINKS:
            for rate in args.rates or WORKLOADS[args.link_workload]["rates"]:
                measure(args.link_workload, link_config, link_label, rate, seed)
    runs = table.frame()
    swept = runs[(runs["workload"] == args.link_workload) & (runs["config"] == link_config)]
    link_caps = capacities(swept, ["workload", "config", "link"])
    link_caps["bandwidth_gbs"] = [swept[swept["link"] == lk]["bandwidth_gbs"].iloc[0] for lk in link_caps["link"]]
    link_caps.to_csv(args.out / "disagg_links.csv", index=False)
    plot(runs, caps, link_caps, args.out / "disagg.png")


if __name__ == "__main__":
    main()
