"""Eviction policies against LRU (SIMULATED): prefix-hit rate and TTFT of lru, lfu and workload
(testbed/core/workload_eviction.py, after "KVCache Cache in the Wild", ATC 2025) on Mooncake windows (open
loop, or grouped into sessions so that each turn carries its turn index) and on synthetic multi-turn
sessions, llama-3.1-8b on the h100-sxm roofline model.

    python -m experiments.studies.kv_eviction                       # -> results/kv_reuse/eviction*.csv
    python -m experiments.studies.kv_eviction --windows 2 --seeds 2 # a quick look
    python -m experiments.studies.kv_eviction --policies lru workload --out results/kv_reuse/paper_policy

Held fixed: the engine (fcfs, chunked prefill, max_num_batched_tokens 8192, block 64, prefix caching,
bf16 KV), the cost model, a device cache of `--capacity` blocks (small enough that eviction decides hits),
the arrival process per workload. Repeats: disjoint windows of the Mooncake trace (the full trace when this
machine has it, else the shipped sample), seeds of the session generator. Reported: the mean and 95% t
interval over repeats of each metric, and of the paired relative change against LRU in the same repeat.
Runs already in the CSV are skipped, so a stopped study resumes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from experiments.studies.cluster_runs import ROOT, RunTable, ci95, compose_cfg, trace_path

OUT = ROOT / "results" / "kv_reuse"
POLICIES = ("lru", "lfu", "workload")  # --policies; workload_hist is the earlier workload-aware variant
METRICS = ("prefix_hit_rate", "mean_ttft_ms", "p99_ttft_ms", "mean_e2el_ms")
ENGINE = ["executor=sim", "device=h100-sxm", "model=llama-3.1-8b", "cache.block_size=64",
          "scheduler.max_num_batched_tokens=8192", "metrics.kv_access_log=false"]  # fmt: skip


def workload_overrides(name: str, repeat: int, args) -> list[str]:
    if name in ("mooncake", "mooncake_sessions"):  # the same requests; as sessions each turn is labelled
        replay = "replay=open_loop" if name == "mooncake" else "replay=sessions"
        return [f"trace.path={trace_path('mooncake')}", f"trace={name}", replay,
                f"trace.start={args.first_request + repeat * args.requests}", f"trace.max_requests={args.requests}",
                f"trace.time_scale={args.time_scale}"]  # fmt: skip
    return ["trace=sessions", "replay=sessions", f"trace.seed={repeat}", f"trace.num_sessions={args.sessions}",
            "trace.turns=[2,8]", "trace.system_tokens=1024", "trace.first_tokens=[512,4096]",
            "trace.new_tokens=[64,512]", "trace.output_tokens=[64,512]", "trace.think_s=5",
            f"trace.session_rate={args.session_rate}"]  # fmt: skip


def run_one(overrides: list[str]) -> dict:
    import contextlib
    import io

    from experiments.run.runner import run_trace

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        return run_trace(compose_cfg(overrides), Path(tmp) / "run")


def paired_changes(frame: pd.DataFrame) -> pd.DataFrame:
    """Per workload and policy: mean and 95% CI of (policy - lru) / lru over the repeats, per metric."""
    rows = []
    base = frame[frame["policy"] == "lru"].set_index(["workload", "repeat"])
    for (workload, policy), group in frame[frame["policy"] != "lru"].groupby(["workload", "policy"]):
        row = {"workload": workload, "policy": policy, "repeats": len(group)}
        for m in METRICS:
            rel = [(r[m] - base.loc[(workload, r["repeat"]), m]) / base.loc[(workload, r["repeat"]), m]
                   for _, r in group.iterrows()]  # fmt: skip
            row[f"{m}_change"], row[f"{m}_change_ci95"] = ci95(rel)
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=4, help="Mooncake windows (repeats)")
    ap.add_argument("--requests", type=int, default=400, help="requests per Mooncake window")
    ap.add_argument("--time-scale", type=float, default=0.5, help="Mooncake arrival speed-up")
    ap.add_argument("--seeds", type=int, default=4, help="session-generator seeds (repeats)")
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--session-rate", type=float, default=1.0)
    ap.add_argument("--first-request", type=int, default=2400, help="Mooncake: where the first window starts")
    ap.add_argument("--mooncake-capacity", type=int, default=6000, help="device KV blocks (64 tokens each)")
    ap.add_argument("--sessions-capacity", type=int, default=600, help="device KV blocks (64 tokens each)")
    ap.add_argument("--workloads", nargs="+", default=["mooncake", "sessions"],
                    help="mooncake (open loop, unlabelled), mooncake_sessions (its requests grouped into "
                    "sessions, turns labelled), sessions (synthetic)")  # fmt: skip
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), help="cache.eviction values (lru first)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    table = RunTable(args.out / "eviction_runs.csv", ["workload", "repeat", "policy", "capacity"])
    capacity = {"mooncake": args.mooncake_capacity, "mooncake_sessions": args.mooncake_capacity,
                "sessions": args.sessions_capacity}  # fmt: skip
    repeats_of = {"mooncake": args.windows, "mooncake_sessions": args.windows, "sessions": args.seeds}
    for workload, repeats in ((w, repeats_of[w]) for w in args.workloads):
        for repeat in range(repeats):
            for policy in args.policies:
                key = {"workload": workload, "repeat": repeat, "policy": policy, "capacity": capacity[workload]}
                if table.done(key):
                    continue
                start = time.perf_counter()
                overrides = [*ENGINE, f"cache.num_blocks={capacity[workload]}", f"cache.eviction={policy}",
                             *workload_overrides(workload, repeat, args)]  # fmt: skip
                summary = run_one(overrides)
                table.add({**key, **{m: summary[m] for m in METRICS}, "completed": summary["completed"],
                           "wall_s": round(time.perf_counter() - start, 1)})  # fmt: skip
                print(key, {m: round(summary[m], 4) for m in METRICS}, flush=True)
    frame = table.frame()
    frame = frame[frame["capacity"] == frame["workload"].map(capacity)]
    means = []
    for (workload, policy), group in frame.groupby(["workload", "policy"], sort=False):
        row = {"workload": workload, "policy": policy, "repeats": len(group)}
        for m in METRICS:
            row[m], row[f"{m}_ci95"] = ci95(group[m].tolist())
        means.append(row)
    pd.DataFrame(means).to_csv(args.out / "eviction.csv", index=False)
    paired_changes(frame).to_csv(args.out / "eviction_vs_lru.csv", index=False)
    print(pd.DataFrame(means).to_string(), paired_changes(frame).to_string(), sep="\n")


if __name__ == "__main__":
    main()
