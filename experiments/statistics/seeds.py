"""Which config keys are seeds, which runs are one configuration, and what a repeat redraws.

Every key that only picks a random draw is listed in SEED_KEYS (tests/runner/test_seeds.py composes every
option of every group in conf/ and checks that no other key is named like a seed). `config_id` hashes a
resolved config without them (and without the repeat index and output settings), so runs that differ only
in their draws group as repeats of one configuration (experiments.statistics.aggregate, experiments.statistics.compare).

What a repeat redraws (experiments.run.repeats): the keys of replay.repeat_seeds (default [seed]: the engine's
sampling and random weights, and the simulator's acceptance draws, executor.seed = ${seed}), and with
replay.redraw_workload the workload's seeds too (WORKLOAD_SEEDS: the trace's synthesised arrivals, lengths
and token ids; which requests the priority scheduler marks urgent). redraw_workload null means: true for
the simulator, whose virtual clock makes repeats of one workload copies, and where replay.repeat_seeds
already names a workload seed; false otherwise (the real engine and the host executor time this machine:
their repeats then measure its noise on the same requests, which experiments.statistics.compare pairs request by
request).
"""

from __future__ import annotations

import hashlib
import json

# every seed-like key of conf/ (dotted paths into the composed config)
SEED_KEYS = ("seed", "trace.seed", "executor.seed", "scheduler.options.seed")
# the ones that draw the workload (redrawn per repeat when replay.redraw_workload)
WORKLOAD_SEEDS = ("trace.seed", "scheduler.options.seed")
# config keys that differ between repeats of one configuration
REPEAT_KEYS = ("replay.repeat", "replay.repeats", "replay.repeat_seeds")
# top-level groups that do not change what is measured
OUTPUT_KEYS = ("results", "wandb", "progress")
# settings that change how fast a run goes, never what it measures
SPEED_KEYS = ("executor.skip_steps",)


def _get(tree, path: str):
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _pop(tree: dict, path: str) -> None:
    *parents, name = path.split(".")
    node = _get(tree, ".".join(parents)) if parents else tree
    if isinstance(node, dict):
        node.pop(name, None)


def _simulated(executor: str | None) -> bool:
    """Whether the executor kind's timing is a virtual clock's: no machine noise (testbed.executor_kinds)."""
    from testbed.executor_kinds import executor_kind

    return executor is not None and executor_kind(executor).simulated


def redraw_workload(resolved: dict) -> bool:
    """replay.redraw_workload of a resolved config (plain dict), null resolved by the executor."""
    value = _get(resolved, "replay.redraw_workload")
    if value is None:
        named = set(_get(resolved, "replay.repeat_seeds") or ()) & set(WORKLOAD_SEEDS)
        return _simulated(_get(resolved, "executor.name")) or bool(named)
    if not isinstance(value, bool):
        raise ValueError(f"replay.redraw_workload: must be true, false or null, got {value!r}")
    return value


def config_id(resolved: dict) -> str:
    """Short hash of a resolved config (plain dict) without seeds, repeat index and output settings;
    replay.redraw_workload enters resolved (null and its executor's default are one configuration)."""
    cfg = json.loads(json.dumps(resolved, default=str))  # a deep copy of plain values
    if isinstance(cfg.get("replay"), dict):
        cfg["replay"]["redraw_workload"] = redraw_workload(cfg)
    for key in SEED_KEYS + REPEAT_KEYS + SPEED_KEYS + tuple(_get(cfg, "replay.repeat_seeds") or ()):
        _pop(cfg, key)
    for key in OUTPUT_KEYS:
        cfg.pop(key, None)
    return hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]
