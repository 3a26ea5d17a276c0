"""whatif.png: the LRU hit-rate curve over capacity with the ideal and the run's own point, and the
reuse-distance distribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def plot_whatif(curve: pd.DataFrame, result, summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments.results.atomic import atomic_write_with

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(curve["capacity_blocks"], curve["lru_hit_rate"], label="LRU (stack distances)")
    a.axhline(summary["ideal_hit_rate"], ls="--", color="gray", label="infinite cache")
    if summary.get("run_prefix_hit_rate") is not None and summary.get("run_num_blocks"):
        a.scatter([summary["run_num_blocks"]], [summary["run_prefix_hit_rate"]], color="C3", zorder=3, label="this run")
    a.set_xlabel("cache capacity (blocks)")
    a.set_ylabel("prefix-hit rate (tokens)")
    a.set_xscale("log")
    a.legend()
    d = result.reuse_distances
    if len(d):
        bins = np.unique(np.logspace(0, np.log10(max(2, d.max())), 40).astype(int))
        b.hist(d, bins=bins)
        b.set_xscale("log")
    b.set_xlabel("reuse distance (distinct blocks between uses)")
    b.set_ylabel("looked-up blocks")
    fig.tight_layout()
    atomic_write_with(path, lambda f: fig.savefig(f, format="png", dpi=100))
    plt.close(fig)
