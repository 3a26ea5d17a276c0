"""Tables for the scheduler shootout (conf/experiment/scheduler_shootout.yaml) from its runs.

    python -m experiments.studies.scheduler_shootout \
        [--runs results/scheduler_shootout/runs] [--out results/scheduler_shootout]

One row per (scheduler, rate): TTFT and TPOT p50/p99, throughput, goodput (both SLOs met) and
preemptions from each run's summary.json, plus the TTFT of the 20% "urgent" requests (the ones the
priority scheduler boosts; the same requests in every run) from requests.parquet.
Writes table.csv and README.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import yaml

from testbed.core.policies.priority import PriorityPolicy

ORDER = ("fcfs", "priority", "sjf", "sarathi", "mlfq", "lpm")


def load(root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(root.glob("**/summary.json")):
        run = path.parent
        s = json.loads(path.read_text())
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        req = pd.read_parquet(run / "requests.parquet")
        share = cfg.get("priority_high_share", 0.2)
        urgent_of = PriorityPolicy(high_share=share, seed=0)
        urgent = req["request_id"].map(
            lambda rid, policy=urgent_of: policy.priority(SimpleNamespace(request_id=rid, priority=0)) < 0
        )
        ttft = (req["first_token_time"] - req["arrival_time"]) * 1e3
        span = req["arrival_time"].max() - req["arrival_time"].min()
        rows.append(
            {
                "scheduler": cfg["scheduler"]["name"],
                "time_scale": cfg["trace"]["time_scale"],
                "offered_rate": round((len(req) - 1) / span, 2) if span > 0 else float("nan"),
                "completed": s["completed"],
                "p50_ttft_ms": s["p50_ttft_ms"],
                "p99_ttft_ms": s["p99_ttft_ms"],
                "p50_tpot_ms": s["p50_tpot_ms"],
                "p99_tpot_ms": s["p99_tpot_ms"],
                "output_throughput": s["output_throughput"],
                "request_throughput": s["request_throughput"],
                "request_goodput": s["request_goodput"],
                "slo_attainment": s["slo_attainment"],
                "urgent_p50_ttft_ms": float(np.percentile(ttft[urgent], 50)),
                "urgent_p99_ttft_ms": float(np.percentile(ttft[urgent], 99)),
                "num_preemptions": s["num_preemptions"],
                "mean_batch_size": s["mean_batch_size"],
                "run": str(run.relative_to(root)),
            }
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["order"] = df["scheduler"].map({n: i for i, n in enumerate(ORDER)})
    return df.sort_values(["time_scale", "order"]).drop(columns="order").reset_index(drop=True)


def markdown(df: pd.DataFrame, slo: dict) -> str:
    cols = [
        "scheduler",
        "offered_rate",
        "p50_ttft_ms",
        "p99_ttft_ms",
        "p50_tpot_ms",
        "p99_tpot_ms",
        "output_throughput",
        "request_goodput",
        "slo_attainment",
        "urgent_p50_ttft_ms",
        "urgent_p99_ttft_ms",
        "num_preemptions",
    ]
    out = [
        "## Scheduler shootout",
        "",
        "Azure conv trace, first 200 requests, lengths x 1/4, open loop at trace times / time_scale; tiny model "
        f"on a shared 2-core CPU (timings are noisy). Goodput SLOs: TTFT <= {slo.get('ttft_ms')} ms, "
        f"TPOT <= {slo.get('tpot_ms')} ms. Urgent: the 20% of requests the priority scheduler boosts.",
        "",
    ]
    for scale, part in df.groupby("time_scale", sort=True):
        out += [
            f"### time_scale {scale} (~{part['offered_rate'].median():.1f} req/s offered)",
            "",
            "| " + " | ".join(cols) + " |",
            "|" + "---|" * len(cols),
        ]
        for _, r in part.iterrows():
            cells = []
            for c in cols:
                v = r[c]
                if c == "slo_attainment":
                    cells.append(f"{v:.0%}")
                elif isinstance(v, float):
                    cells.append(f"{v:.2f}" if c in ("offered_rate", "request_goodput") else f"{v:.0f}")
                else:
                    cells.append(str(v))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("p50_ttft_ms", "TTFT p50 (ms)"),
        ("p99_ttft_ms", "TTFT p99 (ms)"),
        ("p99_tpot_ms", "TPOT p99 (ms)"),
        ("output_throughput", "output tok/s"),
        ("request_goodput", "goodput (req/s)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.3))
    for name, g in df.groupby("scheduler", sort=False):
        g = g.sort_values("time_scale")
        for ax, (col, label) in zip(axes, panels):
            ax.plot(g["offered_rate"], g[col], "o-", label=name)
            ax.set_xlabel("offered rate (req/s)")
            ax.set_title(label)
    for ax in axes[:3]:
        ax.set_yscale("log")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="results/scheduler_shootout/runs")
    ap.add_argument("--out", default="results/scheduler_shootout")
    args = ap.parse_args(argv)
    root, out = Path(args.runs), Path(args.out)
    df = load(root)
    if df.empty:
        raise SystemExit(f"no runs under {root}: run `python run.py -m experiment=scheduler_shootout` first")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "table.csv", index=False, float_format="%.3f")
    first = next(root.glob("**/config.yaml"))
    slo = yaml.safe_load(first.read_text()).get("slo", {})
    md = markdown(df, slo)
    plot(df, out / "shootout.png")
    md += "\n![latency, throughput and goodput against rate](shootout.png)\n"
    (out / "README.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
