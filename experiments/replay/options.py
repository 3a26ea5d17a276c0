"""The replay group's options (conf/replay/*.yaml), declared once: Hydra's typed schema
(experiments/conf/schema.py) and the checks experiments.run.settings applies are derived from these fields.
Each field's `check` names the range run_settings holds it to (null passes for every one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def check(kind: str | None, default: Any = None) -> Any:
    """A field checked as `kind`: count (an integer >= 1), index (>= 0), positive, non-negative, flag."""
    return field(default=default, metadata={"check": kind})


@dataclass
class ReplayOptions:
    name: str = check(None, "offline")  # checked against experiments.replay.driver.MODES (and sessions)
    concurrency: int | None = check("count")  # closed_loop: requests kept in flight
    temperature: float = check("non-negative", 0.0)
    length_scale: float = check("positive", 1.0)
    max_prompt_tokens: int | None = check("count")
    max_output_tokens: int | None = check("count")
    max_duration_s: float | None = check("positive")
    repeats: int = check("count", 1)
    # config keys (experiments.run.repeats names a bad one, so the schema takes any list)
    repeat_seeds: list[Any] = field(default_factory=lambda: ["seed"], metadata={"check": None})
    redraw_workload: bool | None = check("flag")
    repeat: int | None = check("index")  # set per repeat
    warmup_runs: int = check("index", 0)
