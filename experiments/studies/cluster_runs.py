"""Helpers of the cluster studies: compose a config, run it quietly, keep one CSV row per run (a study
that is stopped resumes where it was), and 95% confidence intervals over repeats."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from experiments.statistics.intervals import ci95

ROOT = Path(__file__).resolve().parents[2]
# the full traces, beside the checkout (or beside its worktree folder): nothing needs them
SHARED_TRACES = next(
    (p for p in (ROOT.parent / "shared" / "traces", ROOT.parent.parent / "shared" / "traces") if p.is_dir()),
    ROOT.parent / "shared" / "traces",
)
TRACE_FILES = {  # the full traces when this machine has them, else the shipped samples
    "azure": (SHARED_TRACES / "azure_llm_2023_conv.csv", ROOT / "experiments/data/azure_llm_2023_conv_sample.csv"),
    "mooncake": (
        SHARED_TRACES / "mooncake_fast25_synthetic.jsonl",
        ROOT / "experiments/data/mooncake_fast25_synthetic_sample.jsonl",
    ),
}


def trace_path(name: str) -> str:
    full, sample = TRACE_FILES[name]
    return str(full if full.exists() else sample)


def compose_cfg(overrides: list[str]):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=["progress=false", "wandb.enabled=false", *overrides])


def run_cluster_quietly(overrides: list[str], keep: Path | None = None) -> dict:
    """One cluster run's summary (its folder under `keep`, else a temporary one)."""
    from experiments.cluster.runner import run_cluster

    cfg = compose_cfg(overrides)
    if keep is not None:
        return run_cluster(cfg, keep, quiet=True)
    with tempfile.TemporaryDirectory() as tmp:
        return run_cluster(cfg, Path(tmp) / "run", quiet=True)


class RunTable:
    """Rows of a study in a CSV, written after every run; `done(key)` says whether a row exists."""

    def __init__(self, path: Path, key_columns: list[str]):
        self.path, self.keys = path, key_columns
        self.rows = pd.read_csv(path).to_dict("records") if path.exists() else []

    def done(self, key: dict) -> bool:
        return any(all(str(r.get(k)) == str(v) for k, v in key.items()) for r in self.rows)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(self.rows).to_csv(self.path, index=False)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def summarize_repeats(frame: pd.DataFrame, by: list[str], metrics: list[str]) -> pd.DataFrame:
    """Mean and 95% CI half-width of each metric over the repeats of each group."""
    rows = []
    for key, group in frame.groupby(by, sort=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row["repeats"] = len(group)
        for m in metrics:
            row[m], row[f"{m}_ci95"] = ci95(group[m].tolist())
        rows.append(row)
    return pd.DataFrame(rows)
