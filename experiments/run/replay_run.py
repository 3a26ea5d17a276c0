"""One replay run's shared path, for the single-engine runner (experiments.run.runner) and the cluster runner
(experiments.cluster.runner): the settings read from the config, the progress bar and W&B, driving the
replay under StopSignals (a failure or a signal aborts what is in flight and keeps what was measured), the
summary, writing the results and the sweep-table row, and how the run ends (the error re-raised, or
RunInterrupted). A stop signal that lands while the results are written is deferred: the files are
written whole and summary.json is rewritten to say interrupted."""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
from pathlib import Path
from typing import cast

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from experiments.replay.driver import MODES, Replay
from experiments.results.files import SWEEP_TABLE, append_sweep_row, sweep_row, write_json, write_run
from experiments.results.metrics import DEFAULT_PERCENTILES, check_slo, summarize
from experiments.run.stop_signals import RunInterrupted, StopSignals
from experiments.run.wandb_logger import WandbLogger
from experiments.sessions.metrics import session_summary, turns_table
from experiments.sessions.replay import SessionReplay
from experiments.statistics.seeds import config_id, redraw_workload


def config_value(cfg, path: str, default=None):
    """cfg's value at a dotted path (plain containers, interpolations resolved), or default."""
    if isinstance(cfg, DictConfig):
        value = OmegaConf.select(cfg, path, default=default)
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    node = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def positive(value, key: str, integer: bool = False):
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value > 0 or not math.isfinite(value):
        kind = "an integer >= 1" if integer else "a positive number"
        raise ValueError(f"{key}: must be null or {kind}, got {value!r}")
    return value


@dataclasses.dataclass
class RunSetup:
    """What every replay run reads from the config before it starts, and its progress bar and W&B run."""

    run_dir: Path
    replay_cfg: dict
    mode: str
    slo: dict[str, float]
    percentiles: list
    resolved: dict
    experiment: str
    hydra: dict
    bar: tqdm
    wandb: WandbLogger

    def replay_options(self, source: str | None = None) -> dict:
        """The Replay/SessionReplay keyword arguments every runner passes (the temperature is its own)."""
        return {
            **session_options(self.replay_cfg, self.mode),
            "max_duration_s": positive(self.replay_cfg.get("max_duration_s"), "replay.max_duration_s"),
            "on_finish": lambda _row: self.bar.update(1),
            "source": source,
        }


def run_setup(cfg, run_dir: str | Path, num_requests: int, desc: str = "", quiet: bool = False) -> RunSetup:
    """The run's settings (mode and SLO checked before anything runs), its progress bar and W&B run."""
    run_dir = Path(run_dir)
    replay_cfg = config_value(cfg, "replay", {}) or {}
    mode = replay_cfg.get("name", "offline")
    if mode not in (*MODES, "sessions"):
        raise ValueError(f"replay.name: unknown replay mode {mode!r}; one of {list(MODES)}")
    slo = check_slo(config_value(cfg, "slo"))
    percentiles = list(config_value(cfg, "metrics.percentiles", DEFAULT_PERCENTILES) or DEFAULT_PERCENTILES)
    resolved = cast(dict, OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg))
    experiment = config_value(cfg, "experiment", "default")
    hydra = _hydra_info()
    wandb = WandbLogger(config_value(cfg, "wandb"), run_dir, resolved, name=run_dir.name, group=experiment)
    bar = tqdm(
        total=num_requests,
        unit="req",
        desc=f"{experiment} [{mode}{desc}]",
        dynamic_ncols=True,
        mininterval=0.5,
        disable=quiet or not config_value(cfg, "progress", True),
        file=sys.stderr,
    )
    return RunSetup(run_dir, replay_cfg, mode, slo, percentiles, resolved, experiment, hydra, bar, wandb)


def write_results(
    cfg, setup: RunSetup, stops: StopSignals, summary: dict, requests: pd.DataFrame, steps: pd.DataFrame, *,
    trace_report: dict | None, tables: dict, columns, clock: pd.DataFrame | None = None,
) -> None:  # fmt: skip
    """The run's files, its sweep-table row and the W&B run's end. Called inside StopSignals after `drive`
    (signals deferred): one that lands meanwhile is written into summary.json once the files are whole."""
    write_run(
        setup.run_dir,
        config_yaml=OmegaConf.to_yaml(OmegaConf.create(setup.resolved)),
        requests=requests,
        steps=steps,
        summary=summary,
        trace_report=trace_report,
        clock=clock,
        tables=tables,
    )
    _mark_late_signal(summary, stops, setup.run_dir)
    append_run_row(cfg, setup.run_dir, summary, setup.hydra, columns)
    setup.wandb.finish(summary, requests, exit_code=1 if summary.get("interrupted") else 0)
    _mark_late_signal(summary, stops, setup.run_dir)


def end_run(summary: dict, stops: StopSignals, interrupted: bool, error: Exception | None) -> dict:
    """The summary of a run that went through; otherwise its error, or RunInterrupted for a stop signal."""
    if error is not None:
        raise error
    if interrupted or stops.hits:
        raise RunInterrupted(stops.hits[0] if stops.hits else signal.SIGINT)
    return summary


def _hydra_info() -> dict:
    """Run name, job number and overrides when running under Hydra (empty otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except Exception:
        return {}
    job_num = OmegaConf.select(cast(DictConfig, hc), "job.num", default=None)
    return {"overrides": list(hc.overrides.task), "job_num": job_num}


def _override_columns(cfg, overrides: list[str]) -> dict:
    """Resolved values of the overridden keys (so the swept parameters are sweep-table columns)."""
    cols = {}
    for ov in overrides:
        key = ov.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra") or "/" in key or key in ("experiment",):
            continue
        value = config_value(cfg, key)
        if isinstance(value, dict):
            value = value.get("name", str(value))
            key = f"{key}.name"
        if value is None or isinstance(value, (bool, int, float, str)):
            cols[key] = value
        else:
            cols[key] = str(value)
    return cols


def session_options(replay_cfg: dict, mode: str) -> dict:
    """The session driver's length caps (replay=sessions); nothing for the other modes."""
    if mode != "sessions":
        return {}
    return {
        "max_prompt_tokens": positive(replay_cfg.get("max_prompt_tokens"), "replay.max_prompt_tokens", True),
        "max_output_tokens": positive(replay_cfg.get("max_output_tokens"), "replay.max_output_tokens", True),
    }


def drive(replay: Replay, specs: list, mode: str, concurrency, stops: StopSignals) -> tuple[bool, Exception | None]:
    """Run the replay; returns (interrupted, error). A failure or a signal after the start aborts what is in
    flight and keeps what was measured; from the end of the run a signal waits until the results are written."""
    try:
        replay.run(specs, mode, concurrency)
    except (KeyboardInterrupt, Exception) as e:
        stops.defer()
        if not isinstance(e, KeyboardInterrupt) and replay.start_time is None:
            raise  # rejected before anything ran: nothing to keep
        replay.abort_in_flight()
        replay.end_time = replay.replicas.now
        return (True, None) if isinstance(e, KeyboardInterrupt) else (False, e)
    stops.defer()
    return False, None


def session_tables(replay: Replay, requests: pd.DataFrame, summary: dict, num_sessions: int) -> dict:
    """A session replay's turns table (turns.parquet), its keys added to the summary; nothing otherwise."""
    if not isinstance(replay, SessionReplay):
        return {}
    turns = turns_table(replay.turns_frame(), requests)
    summary.update(session_summary(turns, num_sessions, replay.turns_cut))
    return {"turns.parquet": turns}


def append_run_row(cfg, run_dir: Path, summary: dict, hydra: dict, columns) -> None:
    """The run's row in the sweep table: where it is, how it was launched, `columns` and the overridden keys."""
    table = config_value(cfg, "results.sweep_table") or run_dir.parent / SWEEP_TABLE
    info = {
        "run_dir": _relative(run_dir, Path(table).parent),
        "job_num": hydra.get("job_num"),
        "overrides": " ".join(hydra.get("overrides", [])),
    }
    info.update({col: config_value(cfg, col) for col in columns})
    info.update(_override_columns(cfg, hydra.get("overrides", [])))
    append_sweep_row(Path(table), sweep_row(summary, info))


def _mark_late_signal(summary: dict, stops: StopSignals, run_dir: Path) -> None:
    """A signal deferred while the results were written still ends the run (exit 128 + signum): the
    summary, written before it landed, is rewritten to say interrupted."""
    if stops.hits and not summary.get("interrupted"):
        summary["interrupted"] = True
        summary["signal"] = signal.Signals(stops.hits[0]).name
        write_json(run_dir / "summary.json", summary)


def run_summary(
    cfg, setup: RunSetup, requests, steps, start, end, replay, trace_report, num_requests, stops, interrupted, error
) -> dict:  # fmt: skip
    """The summary of a replay (one engine or a cluster): the serving metrics, how the run went, and which
    configuration it repeats with which seeds (experiments.statistics.aggregate)."""
    slo, percentiles, resolved = setup.slo, setup.percentiles, setup.resolved
    summary = summarize(requests, steps, start, end, slo, percentiles)
    summary.update(
        {
            "experiment": setup.experiment,
            "replay": setup.mode,
            "trace": (trace_report or {}).get("format"),
            "num_requests": num_requests,
            "num_sent": replay.num_sent,
            "interrupted": interrupted,
            "signal": signal.Signals(stops.hits[0]).name if interrupted and stops.hits else None,
            "timed_out": replay.timed_out,
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "start_time": start,
            "end_time": end,
            "slo": slo,
            "percentiles": percentiles,
            "config_id": config_id(resolved),
            "repeat": config_value(cfg, "replay.repeat") or 0,
            "seed": config_value(cfg, "seed"),
            "redraw_workload": redraw_workload(resolved),
        }
    )
    return summary


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)
