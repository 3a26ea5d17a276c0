"""`replay.repeats=N`: run one configuration N times, each in <run dir>/repeat<i>/, with its own draws.

Repeat i sets replay.repeat=i and adds i to every key in replay.repeat_seeds (default [seed]: the engine's
sampling, random weights and the simulator's acceptance draws) and, when replay.redraw_workload is true,
to the workload's seeds (experiments.statistics.seeds.WORKLOAD_SEEDS: trace.seed, so a synthesised workload's
arrivals, lengths and token ids are drawn anew). Null means true for the simulator (a virtual clock:
repeats of one workload would be copies) or when repeat_seeds names a workload seed, else false (repeats
measure this machine's noise on the same requests); each repeat's config records the value it ran with.
Repeat i of two configurations gets the same seeds, so experiments.statistics.compare pairs them.

Each repeat builds a fresh engine (the first run reuses the one it was given), so nothing carries over
between them but warm-up effects of the process: first-call costs fall on repeat 0 unless
replay.warmup_runs discards that many runs of repeat 0's configuration first (in <run dir>/warmup<k>/).
The run folder is a unit: <run dir>/sweep.csv holds its repeats' rows and <run dir>/sweep_ci.csv their intervals
(experiments.statistics.aggregate), so `python -m experiments.statistics.compare A B` takes two such folders.
Each row is also appended to the sweep table a single run would use (results.sweep_table, else the folder
above), so a multirun's table holds every repeat of every job (its callback writes that table's intervals at the end).
One given repeat (replay.repeat=i set, as experiments.run.ab runs each in its own process) runs alone, after
replay.warmup_runs discarded runs of it in the same process.
"""

from __future__ import annotations

import copy
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from experiments.results.files import SWEEP_TABLE, append_sweep_row, read_sweep
from experiments.statistics.aggregate import CI_TABLE, write_aggregate
from experiments.statistics.seeds import WORKLOAD_SEEDS, redraw_workload


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
    """replay.repeats, checked (and replay.redraw_workload with it, before anything runs)."""
    redraw = _get(cfg, "replay.redraw_workload")
    if redraw is not None and not isinstance(redraw, bool):
        raise ValueError(f"replay.redraw_workload: must be true, false or null, got {redraw!r}")
    n = _get(cfg, "replay.repeats")
    n = 1 if n is None else n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"replay.repeats: must be an integer >= 1, got {n!r}")
    return n


def warmup_count(cfg) -> int:
    """replay.warmup_runs, checked: discarded runs before the measured ones."""
    n = _get(cfg, "replay.warmup_runs") or 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"replay.warmup_runs: must be an integer >= 0, got {n!r}")
    return n


def repeat_configs(cfg, n: int) -> list:
    """Copies of cfg for repeats 0..n-1 (replay.repeat set, replay.redraw_workload resolved, seed keys
    offset by the index)."""
    keys = list(_get(cfg, "replay.repeat_seeds") or ["seed"])
    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    if not isinstance(plain, dict):
        raise TypeError(f"a run config is a mapping of groups, got {type(plain).__name__}")
    redraw = redraw_workload(plain)
    workload = [k for k in WORKLOAD_SEEDS if _get(cfg, k) is not None]
    if not redraw and (pinned := [k for k in keys if k in WORKLOAD_SEEDS]):
        raise ValueError(
            f"replay.repeat_seeds redraws {pinned} but replay.redraw_workload=false: drop them, or set "
            "replay.redraw_workload=true"
        )
    if redraw:
        keys += [k for k in workload if k not in keys]
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
        _set(c, "replay.redraw_workload", redraw)
        for key, value in base.items():
            _set(c, key, value + i)
        out.append(c)
    return out


def run_repeats(cfg, run_dir: str | Path, engine=None, run_one=None) -> dict:
    """Run the N repeats; returns {"repeats": N, "summaries": [...], "sweep_ci": <run dir>/sweep_ci.csv}.
    run_one(cfg, dir) runs one repeat (default: experiments.run.runner.run_trace with a fresh engine each,
    the first reusing `engine`)."""
    from experiments.run.runner import build_engine, config_value, run_trace

    given = [engine] if engine is not None else []  # the first repeat reuses it; later ones get their own

    def fresh_engine_run(c, d):
        return run_trace(c, d, given.pop() if given else build_engine(c))

    run = run_one or fresh_engine_run

    run_dir = Path(run_dir)
    own = run_dir / SWEEP_TABLE
    outer = Path(config_value(cfg, "results.sweep_table") or run_dir.parent / SWEEP_TABLE)
    configs = repeat_configs(cfg, repeat_count(cfg))
    for c in configs:  # the warm-ups run here, once; each repeat is a single run
        _set(c, "replay.warmup_runs", 0)
    for stale in (own, run_dir / CI_TABLE):  # a folder run into again holds only the new repeats
        stale.unlink(missing_ok=True)
    for k in range(warmup_count(cfg)):  # repeat 0's configuration, its row kept in its own folder only
        c = copy.deepcopy(configs[0])
        _set(c, "results.sweep_table", str(run_dir / f"warmup{k}" / SWEEP_TABLE))
        run(c, run_dir / f"warmup{k}")
    summaries = []
    for i, c in enumerate(configs):
        _set(c, "results.sweep_table", str(own))
        try:
            summaries.append(run(c, run_dir / f"repeat{i}"))
        finally:  # an interrupted or failed repeat has its row too; one that never started has none
            if outer.resolve() != own.resolve() and _rows(own) > i:
                _copy_last_row(own, outer)
    ci = write_aggregate(own)
    return {"repeats": len(summaries), "summaries": summaries, "sweep_ci": ci}


def run_after_warmup(cfg, run_dir: str | Path, engine=None) -> dict:
    """One given repeat (replay.repeat set: experiments.run.ab's runs) after replay.warmup_runs discarded runs of
    it in this process, in <run dir>/warmup<k>/ (their rows in their own folder); each run a fresh engine
    (the first warm-up reuses `engine`). Returns the measured run's summary."""
    from experiments.run.runner import build_engine, run_trace

    run_dir = Path(run_dir)
    single = copy.deepcopy(cfg)
    _set(single, "replay.warmup_runs", 0)
    for k in range(warmup_count(cfg)):
        c = copy.deepcopy(single)
        _set(c, "results.sweep_table", str(run_dir / f"warmup{k}" / SWEEP_TABLE))
        run_trace(c, run_dir / f"warmup{k}", engine if k == 0 else None)
    return run_trace(single, run_dir, build_engine(single))


def _rows(table: Path) -> int:
    return len(read_sweep(table, include_incomplete=True)) if table.exists() else 0


def _copy_last_row(own: Path, outer: Path) -> None:
    """Append the run folder's newest row to the outer sweep table, its run_dir relative to that table."""
    if not own.exists():
        return
    row = read_sweep(own, include_incomplete=True).iloc[-1].to_dict()
    path = (own.parent / str(row["run_dir"])).resolve()
    try:
        row["run_dir"] = str(path.relative_to(outer.parent.resolve()))
    except ValueError:
        row["run_dir"] = str(path)
    append_sweep_row(outer, row)
