"""Tables for the fragmentation experiment (conf/experiment/fragmentation.yaml) from its runs.

    python -m experiments.studies.fragmentation [--runs results/fragmentation/runs] [--out results/fragmentation]

Each run's steps.parquet has the allocator's memory breakdown after every step (KVCacheStats: token /
reserved / internal / external / free slots, which partition the cache). Shares are reported three ways:
    time    averaged over the run, each step weighted by its duration (the runner's convention)
    step    averaged over steps
    busy    averaged over the steps in which requests were waiting (the cache under pressure: what the
            vLLM paper's Fig. 2 measures)
Writes allocators.csv, block_size.csv, README.md (tables), fragmentation.png and allocators_steps.csv
(the per-step shares, thinned to <= 400 steps per allocator, for plots).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

PARTS = ("token", "reserved", "internal", "external", "free")
ALLOCATOR_ORDER = ("static_max", "static_pow2", "static_oracle", "paged")
# token-state shares in the vLLM paper's Fig. 2 (Orca max / pow2 / oracle, vLLM), for comparison
PAPER_TOKEN_SHARE = {"static_max": 0.204, "static_pow2": 0.268, "static_oracle": 0.382, "paged": 0.963}


def step_shares(steps: pd.DataFrame) -> pd.DataFrame:
    total = steps["kv_num_blocks"] * steps["kv_block_size"]
    out = pd.DataFrame({p: steps[f"kv_{p}_slots"] / total for p in PARTS})
    out.insert(0, "step", steps["step"])
    out["busy"] = steps["num_waiting"] > 0
    out["duration_s"] = steps["duration_s"]
    return out


def summarise(shares: pd.DataFrame) -> dict:
    row = {}
    w = shares["duration_s"].clip(lower=0)
    busy = shares[shares["busy"]]
    for p in PARTS:
        row[f"{p}_time"] = float((shares[p] * w).sum() / w.sum()) if w.sum() > 0 else float(shares[p].mean())
        row[f"{p}_step"] = float(shares[p].mean())
        row[f"{p}_busy"] = float(busy[p].mean()) if len(busy) else float("nan")
    row["busy_steps"] = float(shares["busy"].mean())
    return row


def load_runs(root: Path) -> list[dict]:
    runs = []
    for summary in sorted(root.glob("**/summary.json")):
        run = summary.parent
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        shares = step_shares(pd.read_parquet(run / "steps.parquet"))
        s = pd.read_json(summary, typ="series")
        runs.append(
            {
                "run": str(run.relative_to(root)),
                "cache": cfg["cache"]["name"],
                "block_size": cfg["cache"]["block_size"],
                "num_requests": int(s["completed"]),
                "num_steps": len(shares),
                "num_preemptions": int(s["num_preemptions"]),
                "mean_batch": round(float(s["mean_batch_size"]), 1),
                "output_throughput": round(float(s["output_throughput"]), 1),
                **summarise(shares),
                "_shares": shares,
            }
        )
    return runs


def _markdown(df: pd.DataFrame, cols: list[str], title: str) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = [
            f"{r[c]:.1%}"
            if isinstance(r[c], float) and (c.split("_")[0] in PARTS or c.startswith(("busy", "paper")))
            else str(r[c])
            for c in cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="results/fragmentation/runs")
    ap.add_argument("--out", default="results/fragmentation")
    args = ap.parse_args(argv)
    root, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(root)
    if not runs:
        raise SystemExit(f"no runs under {root}: run `python run.py -m experiment=fragmentation` first")
    allocs = [r for r in runs if r["run"].startswith("allocators")]
    blocks = [r for r in runs if r["run"].startswith("block_size")]
    cols = (
        ["cache", "block_size"]
        + [f"{p}_{k}" for k in ("time", "busy") for p in PARTS]
        + ["busy_steps", "mean_batch", "num_preemptions", "num_steps", "output_throughput"]
    )
    md = [
        "## Fragmentation study: KV memory breakdown (shares of the whole cache)",
        "",
        "Azure conv trace, first 400 requests, lengths x 1/2, offline, tiny model, max_model_len 2048, "
        "16,384 token slots. `_time`: time-averaged over the run; `_busy`: averaged over steps with "
        "requests waiting for memory or seats.",
        "",
    ]
    if allocs:
        df = pd.DataFrame([{k: v for k, v in r.items() if k != "_shares"} for r in allocs])
        df["order"] = df["cache"].map({c: i for i, c in enumerate(ALLOCATOR_ORDER)})
        df = df.sort_values("order").drop(columns="order")
        df[cols].to_csv(out / "allocators.csv", index=False, float_format="%.4f")
        md.append(_markdown(df, ["cache", "block_size"] + [f"{p}_time" for p in PARTS], "Time-averaged"))
        df["paper_token"] = df["cache"].map(PAPER_TOKEN_SHARE)
        md.append(
            _markdown(
                df,
                ["cache", "block_size"] + [f"{p}_busy" for p in PARTS] + ["busy_steps", "paper_token"],
                "Under memory pressure (steps with waiting requests; paper_token: the vLLM paper's "
                "Fig. 2 token-state share)",
            )
        )
        series = []
        for r in allocs:  # per-step series, thinned to <= 400 points per allocator
            s = r["_shares"]
            s = s.iloc[:: max(1, len(s) // 400)].copy()
            s.insert(0, "cache", r["cache"])
            series.append(s)
        pd.concat(series).to_csv(out / "allocators_steps.csv", index=False, float_format="%.4f")
    if blocks:
        df = pd.DataFrame([{k: v for k, v in r.items() if k != "_shares"} for r in blocks])
        df = df.sort_values("block_size")
        df[cols].to_csv(out / "block_size.csv", index=False, float_format="%.4f")
        md.append(
            _markdown(
                df,
                ["block_size"] + [f"{p}_time" for p in PARTS] + ["token_busy", "mean_batch"],
                "Paged, block size vs utilisation (time-averaged; token_busy under pressure)",
            )
        )
    plot(allocs, blocks, out / "fragmentation.png")
    md.append("![breakdown and block-size curve](fragmentation.png)\n")
    (out / "README.md").write_text("\n".join(md))
    print("\n".join(md))


def plot(allocs: list[dict], blocks: list[dict], path: Path) -> None:
    """Stacked memory breakdown per allocator (time-averaged), and token share against block size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    colors = {
        "token": "#2b8a3e",
        "reserved": "#74b816",
        "internal": "#e8590c",
        "external": "#c92a2a",
        "free": "#ced4da",
    }
    order = {c: i for i, c in enumerate(ALLOCATOR_ORDER)}
    allocs = sorted(allocs, key=lambda r: order.get(r["cache"], 99))
    names = [r["cache"] for r in allocs]
    bottom = [0.0] * len(allocs)
    for p in PARTS:
        vals = [100 * r[f"{p}_busy"] for r in allocs]
        axes[0].bar(names, vals, bottom=bottom, color=colors[p], label=p)
        for i, v in enumerate(vals):
            if p == "token":
                axes[0].text(i, v / 2, f"{v:.0f}%", ha="center", va="center", color="white", fontsize=9)
        bottom = [b + v for b, v in zip(bottom, vals)]
    axes[0].set_ylabel("% of KV cache (under load)")
    axes[0].set_title("Memory breakdown per allocator")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    if blocks:
        blocks = sorted(blocks, key=lambda r: r["block_size"])
        bs = [r["block_size"] for r in blocks]
        for key, label in (("token_busy", "token states, under load"), ("token_time", "token states, time-avg")):
            axes[1].plot(bs, [100 * r[key] for r in blocks], "o-", label=label)
        axes[1].plot(
            bs,
            [100 * (r["internal_busy"] + r["reserved_busy"]) for r in blocks],
            "s--",
            label="tail-block slack (reserved + internal)",
        )
        axes[1].set_xscale("log", base=2)
        axes[1].set_xlabel("paged block size (tokens)")
        axes[1].set_ylabel("% of KV cache")
        axes[1].set_title("Paged: block size vs utilisation")
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
