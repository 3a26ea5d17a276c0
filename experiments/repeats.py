"""`replay.repeats=N`: run one configuration N times, each in <run dir>/repeat<i>/, with its own seeds.

Repeat i sets replay.repeat=i and adds i to every key in replay.repeat_seeds (default [seed]: the engine's
seed; add trace.seed to redraw a synthetic trace per repeat). Each repeat builds a fresh engine (the
first reuses the one it was given), so nothing carries over between them but warm-up effects of the
process (first-call costs fall on repeat 0; compare repeats, not repeat 0 against a later run, when
that matters). Every repeat appends its row to the sweep table the single run would have used, with
its repeat index, seeds and config_id; when all are done, sweep_ci.csv is rewritten next to it
(experiments.aggregate), except in a Hydra multirun, whose callback writes it once at the end.
"""

from __future__ import annotations

import copy
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from experiments.aggregate import write_aggregate
from experiments.results import SWEEP_TABLE


def _get(cfg, path: str):
    if isinstance(cfg, DictConfig):
        return OmegaConf.select(cfg, path)
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(cfg, path: str, value) -> None:
    if isinstance(cfg, DictConfig):
        with open_dict(cfg):
            OmegaConf.update(cfg, path, value, merge=False, force_add=True)
        return
    *parents, name = path.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[name] = value


def repeat_count(cfg) -> int:
    n = _get(cfg, "replay.repeats")
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"replay.repeats: must be an integer >= 1, got {n!r}")
    return n


def repeat_configs(cfg, n: int) -> list:
    """Copies of cfg for repeats 0..n-1 (replay.repeat set, seed keys offset by the index)."""
    keys = list(_get(cfg, "replay.repeat_seeds") or ["seed"])
    base = {}
    for key in keys:
        value = _get(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"replay.repeat_seeds: {key} must be an integer config value, got {value!r}")
        base[key] = value
    out = []
    for i in range(n):
        c = copy.deepcopy(cfg)
        _set(c, "replay.repeat", i)
        for key, value in base.items():
            _set(c, key, value + i)
        out.append(c)
    return out


def run_repeats(cfg, run_dir: str | Path, engine=None) -> dict:
    """Run the N repeats; returns {"repeats": N, "summaries": [...], "sweep_ci": path}."""
    from experiments.runner import build_engine, config_value, run_trace

    run_dir = Path(run_dir)
    table = Path(config_value(cfg, "results.sweep_table") or run_dir.parent / SWEEP_TABLE)
    summaries = []
    for i, c in enumerate(repeat_configs(cfg, repeat_count(cfg))):
        _set(c, "results.sweep_table", str(table))
        summaries.append(run_trace(c, run_dir / f"repeat{i}", engine if i == 0 and engine else build_engine(c)))
    # in a multirun the sweep's callback writes sweep_ci.csv once, when every job is done
    ci = None if _in_multirun() else write_aggregate(table)
    return {"repeats": len(summaries), "summaries": summaries, "sweep_ci": ci}


def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    except ImportError:  # pragma: no cover
        return False
