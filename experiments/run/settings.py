"""Everything a run is built from, typed and checked before it starts: `run_settings(cfg)`.

run.py calls it first, so an unknown key or a bad value in any group is refused (naming the key) before a
model is loaded or a folder written; tests/config/test_every_leaf.py holds each leaf of conf/ to changing
what it builds. The engine's and the cluster's settings are the objects they are built from; the trace's,
the replay's and the offline workload's are the checked options their drivers read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from experiments.replay.options import ReplayOptions
from experiments.results.metrics import DEFAULT_PERCENTILES, check_slo
from experiments.run.engine_config import engine_config_from_cfg
from testbed.cluster.config import ClusterConfig
from testbed.config import EngineConfig
from testbed.server.settings import ServerSettings

MODES = (None, "offline", "replay", "serve", "route")
# Top-level keys of conf/ (groups and run-wide values); any other (`+max_num_seqs=8`) is refused, naming it.
ROOT_KEYS = {
    *("model", "kernel", "device", "executor", "scheduler", "cache", "spec", "server", "trace", "replay"),
    *("cluster", "parallel", "link", "experiment", "mode", "seed", "dtype", "max_model_len", "workload"),
    *("slo", "metrics", "progress", "results", "wandb", "structured_outputs"),
    "priority_high_share",  # an experiment's share of urgent requests, read by scheduler=priority's options
}
REPLAY_KEYS = {f.name: f.metadata["check"] for f in fields(ReplayOptions)}  # key -> its check (None: below)
METRICS_KEYS = {"percentiles": None, "kv_access_log": "flag"}  # percentiles: checked in run_settings
WORKLOAD_KEYS = {"num_prompts": "count", "max_tokens": "count", "temperature": "non-negative"}


@dataclass(frozen=True)
class RunSettings:
    mode: str | None
    engine: EngineConfig
    cluster: ClusterConfig
    trace: dict | None  # the trace loader's options, format defaults applied and checked
    replay: dict
    workload: dict
    slo: dict
    metrics: dict  # percentiles (p50_ ... keys) and what else the recorder keeps
    server: ServerSettings


def run_settings(cfg: DictConfig) -> RunSettings:
    unknown = sorted(set(cfg) - ROOT_KEYS)
    if unknown:
        raise ValueError(f"{unknown[0]}: not a top-level setting (those are {sorted(ROOT_KEYS)})")
    if cfg.mode not in MODES:
        raise ValueError(f"mode: one of {MODES[1:]} or null, got {cfg.mode!r}")
    percentiles = _plain(cfg.metrics.percentiles)
    if not isinstance(percentiles, list) or not all(_number(p) and 0 < p < 100 for p in percentiles):
        raise ValueError(f"metrics.percentiles: a list of numbers in (0, 100), got {percentiles!r}")
    return RunSettings(
        cfg.mode,
        engine_config_from_cfg(cfg),
        ClusterConfig.from_any(cfg.cluster),
        trace_options(cfg.get("trace")),
        _checked("replay", _plain(cfg.replay), REPLAY_KEYS),
        _checked("workload", _plain(cfg.workload), WORKLOAD_KEYS),
        check_slo(_plain(cfg.slo)),
        {**_checked("metrics", _plain(cfg.metrics), METRICS_KEYS), "percentiles": percentiles or DEFAULT_PERCENTILES},
        ServerSettings.from_cfg(cfg.server),
    )


def trace_options(trace: Any) -> dict | None:
    """The options the trace's loader reads (experiments.traces, experiments.sessions), checked without
    reading the trace."""
    import importlib

    from experiments.sessions import SOURCES
    from experiments.traces import LOADERS, TraceError
    from experiments.traces.config import options

    if trace is None:
        return None
    trace = _plain(trace)
    name = trace.get("name")
    if name in ("sessions", "sharegpt_sessions"):
        module = importlib.import_module(f"experiments.sessions.{'synthetic' if name == 'sessions' else 'sharegpt'}")
        opts = module.session_options(trace, module.DEFAULTS)
    elif name in LOADERS or name in SOURCES:
        module = importlib.import_module(f"experiments.traces.{name.removesuffix('_sessions')}")
        opts = options(trace, module.DEFAULTS)
    else:
        raise TraceError(f"unknown trace format {name!r}; one of {sorted(LOADERS)}", "trace config", field="name")
    check = getattr(module, "check", None)  # a format's checks that need no file (rates, counts, lengths)
    if check is not None:
        check(opts)
    return opts


def _checked(group: str, values: dict, kinds: dict) -> dict:
    unknown = sorted(set(values) - set(kinds))
    if unknown:
        raise ValueError(f"{group}.{unknown[0]}: not a {group} setting ({sorted(kinds)})")
    for key, kind in kinds.items():
        value = values.get(key)
        if value is None or kind is None:
            continue
        ok = {
            "count": isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            "index": isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            "positive": _number(value) and value > 0,
            "non-negative": _number(value) and value >= 0,
            "flag": isinstance(value, bool),
        }[kind]
        if not ok:
            what = {"count": "an integer >= 1", "index": "an integer >= 0", "flag": "true or false"}.get(
                kind, f"a {kind} number"
            )
            raise ValueError(f"{group}.{key}: must be null or {what}, got {value!r}")
    if group == "replay":
        from experiments.replay.driver import MODES as REPLAY_MODES

        if values.get("name") not in (*REPLAY_MODES, "sessions"):
            raise ValueError(f"replay.name: one of {(*REPLAY_MODES, 'sessions')}, got {values.get('name')!r}")
        seeds = values.get("repeat_seeds")
        if not isinstance(seeds, list) or not all(isinstance(k, str) for k in seeds):
            raise ValueError(f"replay.repeat_seeds: a list of config keys, got {seeds!r}")
    return values


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
