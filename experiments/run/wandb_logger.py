"""Weights & Biases logging for a run: config, per-step series, the summary and a requests table.

Switched by config (`wandb.enabled`, off by default) and by the environment: WANDB_MODE=disabled turns
it off whatever the config says, WANDB_MODE=offline writes the run under <run_dir>/wandb/ for a later
`wandb sync`. `wandb.mode` in the config (online | offline | disabled) wins over the environment only
when set. wandb is imported only when logging is on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pandas as pd

WandbMode = Literal["online", "offline", "disabled"]
_MODES: dict[str, WandbMode] = {"online": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}


def resolve_mode(cfg) -> WandbMode:
    """'disabled' | 'offline' | 'online' for a wandb config section (None/absent = disabled)."""
    if cfg is None or not cfg.get("enabled", False):
        return "disabled"
    mode = cfg.get("mode") or os.environ.get("WANDB_MODE") or "online"
    if mode not in _MODES:
        raise ValueError(f"wandb.mode: one of online, offline, disabled; got {mode!r}")
    return _MODES[mode]


class WandbLogger:
    def __init__(self, cfg, run_dir: Path, config: dict, name: str | None = None, group: str | None = None):
        self.mode = resolve_mode(cfg)
        self.run = None
        self.log_every = max(1, int(cfg.get("log_every", 1))) if cfg is not None else 1
        if self.mode == "disabled":
            return
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg.get("project") or "testbed",
            entity=cfg.get("entity"),
            group=cfg.get("group") or group,
            name=cfg.get("name") or name,
            tags=list(cfg.get("tags") or []),
            config=config,
            dir=str(run_dir),
            mode=self.mode,
            reinit="finish_previous",
        )

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log_step(self, row: dict) -> None:
        if self.run is None or row["step"] % self.log_every:
            return
        self.run.log(
            {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}, step=int(row["step"])
        )

    def finish(self, summary: dict, requests: pd.DataFrame, exit_code: int = 0) -> None:
        if self.run is None:
            return
        import wandb

        self.run.summary.update(
            {k: v for k, v in summary.items() if v is None or isinstance(v, (bool, int, float, str))}
        )
        table = requests.drop(columns=["token_times"], errors="ignore")
        self.run.log({"requests": wandb.Table(dataframe=table.astype(object).where(table.notna(), None))})
        self.run.finish(exit_code=exit_code)
        self.run = None
