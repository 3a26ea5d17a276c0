"""Hit-rate what-ifs from a run's recorded block-access stream (`python -m experiments.kv_whatif RUN_DIR`).

From kv_accesses.parquet (metrics.kv_access_log, on by default) in one pass (experiments.kv_whatif.stack):
the LRU prefix-hit rate at every cache capacity, the infinite-cache ideal, the distribution of reuse
(stack) distances and how concentrated reuse is (share of reuses going to the most reused 10% of blocks,
the statistic "KVCache Cache in the Wild" (Wang et al., USENIX ATC 2025) reports). Writes whatif.json,
whatif_curve.csv and whatif.png into the run folder (or --out).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.results.atomic import atomic_write_text

from .stack import INF, StackResult, stack_distances
from .stream import read_accesses


def run_shape(run_dir: Path) -> tuple[int, int | None, float | None]:
    """(block size, the run's KV blocks, its measured prefix-hit rate) from its steps and summary."""
    with open(run_dir / "steps.parquet", "rb") as f:
        steps = pd.read_parquet(f, columns=["kv_block_size", "kv_num_blocks"])
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    if not len(steps):
        raise ValueError(f"{run_dir}: the run took no step: no block size to read")
    return int(steps["kv_block_size"].iloc[0]), int(steps["kv_num_blocks"].iloc[0]), summary.get("prefix_hit_rate")


def analyze_stream(accesses: pd.DataFrame, block_size: int) -> StackResult:
    events = zip(accesses["kind"], accesses["request_id"], accesses["num_tokens"], accesses["hashes"])
    return stack_distances(events, block_size)


def report(result: StackResult, num_blocks: int | None, measured: float | None) -> dict:
    finite = result.reuse_distances
    out = {
        "block_size": result.block_size,
        "lookups": result.num_lookups,
        "prompt_tokens": result.prompt_tokens,
        "looked_up_blocks": int(len(result.distances)),
        "distinct_items": result.num_items,
        "ideal_hit_rate": result.ideal_hit_rate,
        "capacity_for_ideal_blocks": int(result.distances[result.distances != INF].max(initial=0)),
        "reuse_distance_p50": float(np.median(finite)) if len(finite) else None,
        "reuse_distance_p90": float(np.percentile(finite, 90)) if len(finite) else None,
        "top10pct_blocks_reuse_share": result.top_share(0.1),
        "run_num_blocks": num_blocks,
        "run_prefix_hit_rate": measured,
        "lru_hit_rate_at_run_capacity": float(result.hit_rate([num_blocks])[0]) if num_blocks else None,
    }
    return out


def analyze(run_dir: str | Path, out_dir: str | Path | None = None, plot: bool = True) -> dict:
    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    block_size, num_blocks, measured = run_shape(run_dir)
    result = analyze_stream(read_accesses(run_dir), block_size)
    summary = report(result, num_blocks, measured)
    caps, rates = result.curve(max(summary["capacity_for_ideal_blocks"], num_blocks or 1))
    curve = pd.DataFrame({"capacity_blocks": caps, "lru_hit_rate": rates})
    atomic_write_text(out_dir / "whatif_curve.csv", curve.to_csv(index=False))
    atomic_write_text(out_dir / "whatif.json", json.dumps(summary, indent=2) + "\n")
    if plot:
        from .plot import plot_whatif

        plot_whatif(curve, result, summary, out_dir / "whatif.png")
    return summary


__all__ = ["analyze", "analyze_stream", "report", "stack_distances"]
