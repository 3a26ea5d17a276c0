"""The experiment runner: load a trace, replay it through an Engine, record, summarise, write results.

    python run.py trace=azure                      # open the shipped Azure sample, replay offline
    python run.py trace=azure replay=open_loop trace.time_scale=2 trace.max_requests=200
    python run.py trace=mooncake replay=closed_loop replay.concurrency=8

`run_trace(cfg, run_dir)` is the Hydra-free entry (any mapping-like cfg with the keys of conf/config.yaml);
`replay_specs` runs an already built request list (the built-in offline workload uses it too).
Ctrl-C, SIGTERM (Slurm's scancel and time limit, `docker stop`, `kill`) and SIGHUP (a closed terminal):
in-flight requests are aborted, everything measured so far is written (summary.json says
"interrupted": true and names the signal) and RunInterrupted (a KeyboardInterrupt) is re-raised; run.py
exits with 128 + the signal number. An exception during the replay is handled the same way
(summary.json "error": the message) and re-raised.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import signal
import sys
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from experiments.frozen_gc import frozen_gc
from experiments.kv_metrics import kv_reuse_summary
from experiments.kv_whatif.stream import FILE as ACCESS_FILE
from experiments.kv_whatif.stream import access_frame
from experiments.metrics import DEFAULT_PERCENTILES, check_slo, summarize
from experiments.recorder import Recorder
from experiments.replay import MODES, Replay
from experiments.results import SWEEP_TABLE, append_sweep_row, sweep_row, write_json, write_run
from experiments.run_console import print_summary
from experiments.seeds import config_id, redraw_workload
from experiments.sessions import is_session_trace, load_sessions, session_report
from experiments.sessions.metrics import session_summary, turns_table
from experiments.sessions.replay import SessionReplay
from experiments.stop_signals import RunInterrupted, StopSignals
from experiments.traces import RequestSpec, load_trace
from experiments.wandb_logger import WandbLogger

# Config values copied into every sweep-table row (dotted paths into the resolved config).
SWEEP_COLUMNS = (
    "model.name",
    "kernel.name",
    "executor.name",
    "device.name",
    "scheduler.name",
    "scheduler.max_num_batched_tokens",
    "scheduler.max_num_seqs",
    "cache.name",
    "cache.block_size",
    "cache.prefix_caching",
    "trace.name",
    "trace.max_requests",
    "trace.time_scale",
    "replay.name",
    "replay.concurrency",
    "seed",
    "trace.seed",
    "executor.seed",
)


# ---- config helpers -------------------------------------------------------------------------------
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


def _positive(value, key: str, integer: bool = False):
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value > 0 or not math.isfinite(value):
        kind = "an integer >= 1" if integer else "a positive number"
        raise ValueError(f"{key}: must be null or {kind}, got {value!r}")
    return value


def apply_length_policy(specs: list[RequestSpec], replay_cfg) -> tuple[list[RequestSpec], dict]:
    """The replay's length policy, applied after the trace's own (max_model_len) policy:

    lengths are multiplied by replay.length_scale (rounded up, at least 1), then capped at
    replay.max_prompt_tokens / replay.max_output_tokens. A shortened prompt keeps its first tokens, so
    shared prefixes (Mooncake hash blocks, system prompts) survive. Every change is counted."""
    scale = _positive(config_value(replay_cfg, "length_scale", 1.0), "replay.length_scale")
    max_p = _positive(config_value(replay_cfg, "max_prompt_tokens"), "replay.max_prompt_tokens", integer=True)
    max_o = _positive(config_value(replay_cfg, "max_output_tokens"), "replay.max_output_tokens", integer=True)
    out, n_p, n_o = [], 0, 0
    before = [sum(len(s.prompt_token_ids) for s in specs), sum(s.max_tokens for s in specs)]
    for spec in specs:
        p, o = len(spec.prompt_token_ids), spec.max_tokens
        if scale != 1.0:
            p, o = max(1, math.ceil(p * scale)), max(1, math.ceil(o * scale))
        p, o = min(p, max_p or p), min(o, max_o or o)
        if p != len(spec.prompt_token_ids) or o != spec.max_tokens:
            n_p += p != len(spec.prompt_token_ids)
            n_o += o != spec.max_tokens
            spec = dataclasses.replace(spec, prompt_token_ids=spec.prompt_token_ids[:p], max_tokens=o)
        out.append(spec)
    report = {
        "length_scale": scale,
        "max_prompt_tokens": max_p,
        "max_output_tokens": max_o,
        "clipped_prompts": n_p,
        "clipped_outputs": n_o,
        "prompt_tokens_before": before[0],
        "output_tokens_before": before[1],
        "prompt_tokens_after": sum(len(s.prompt_token_ids) for s in out),
        "output_tokens_after": sum(s.max_tokens for s in out),
    }
    return out, report


def _hydra_info() -> dict:
    """Run name, job number and overrides when running under Hydra (empty otherwise)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except Exception:
        return {}
    return {"overrides": list(hc.overrides.task), "job_num": OmegaConf.select(hc, "job.num", default=None)}


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


# ---- entry points ---------------------------------------------------------------------------------
def build_engine(cfg, record_clock: bool = True):
    """The engine of a run. A real run records every reading of its clock (clock.parquet), so that a
    simulation of the same trace and config can replay it (executor=sim executor.cost_model=replay_steps)."""
    from experiments.engine_config import engine_config_from_cfg
    from testbed import Engine
    from testbed.executor_kinds import executor_kind
    from testbed.sim.clock import RecordingClock

    config = engine_config_from_cfg(cfg)
    clock = RecordingClock() if record_clock and executor_kind(config.executor).records_clock else None
    return Engine(config, clock=clock)


def trace_vocab_size(engine) -> int:
    """Ids the synthesised prompts may use: the tokenizer's regular vocabulary (no added tokens)."""
    vocab = engine.arch.vocab_size
    tok = getattr(engine, "tokenizer", None)
    if tok is not None and getattr(tok, "vocab_size", None):
        vocab = min(vocab, tok.vocab_size)
    return vocab


def run_trace(cfg, run_dir: str | Path, engine=None) -> dict:
    """Replay cfg.trace with cfg.replay; returns the summary (also written to run_dir/summary.json).
    With replay.repeats > 1 or replay.warmup_runs > 0: each repeat in run_dir/repeat<i>/ (experiments.repeats)."""
    from experiments.repeats import repeat_count, run_repeats, warmup_count

    repeated = repeat_count(cfg) > 1 or warmup_count(cfg) > 0
    if repeated and config_value(cfg, "replay.repeat") is None:
        return run_repeats(cfg, run_dir, engine)
    trace_cfg = config_value(cfg, "trace")
    if not trace_cfg:
        raise ValueError(
            "mode=replay needs a trace: trace=azure|mooncake|burstgpt|sharegpt|synthetic "
            "(and trace.path=FILE for file-based traces)"
        )
    check_slo(config_value(cfg, "slo"))  # fail before loading a model
    if config_value(cfg, "replay.name") == "sessions" or is_session_trace(trace_cfg):
        return run_sessions(cfg, run_dir, engine, trace_cfg)
    engine = engine or build_engine(cfg)
    trace = load_trace(
        trace_cfg,
        vocab_size=trace_vocab_size(engine),
        max_model_len=engine.max_model_len,
        tokenizer=getattr(engine, "tokenizer", None),
    )
    specs, length_report = apply_length_policy(trace.requests, config_value(cfg, "replay", {}))
    report = {**trace.report, "replay_length_policy": length_report}
    return replay_specs(cfg, run_dir, engine, specs, trace_report=report, source=trace.report.get("path"))


def check_session_config(cfg, trace_cfg) -> None:
    """replay=sessions and a session source come together; the length policy's scale is refused."""
    if config_value(cfg, "replay.name") != "sessions" or not is_session_trace(trace_cfg):
        raise ValueError(
            f"replay=sessions goes with a session source (trace=sessions|sharegpt_sessions|mooncake_sessions) "
            f"and back; got replay={config_value(cfg, 'replay.name')!r}, trace={trace_cfg.get('name')!r}"
        )
    if config_value(cfg, "replay.length_scale", 1.0) != 1.0:
        raise ValueError("replay.length_scale: not applied to sessions (their histories come from the engine)")


def run_sessions(cfg, run_dir: str | Path, engine, trace_cfg) -> dict:
    """A multi-turn session workload (experiments.sessions): replay=sessions with a session source."""
    check_session_config(cfg, trace_cfg)
    engine = engine or build_engine(cfg)
    sessions = load_sessions(
        trace_cfg,
        vocab_size=trace_vocab_size(engine),
        max_model_len=engine.max_model_len,
        tokenizer=getattr(engine, "tokenizer", None),
    )
    report = {"format": trace_cfg.get("name"), "path": trace_cfg.get("path"), **session_report(sessions)}
    return replay_specs(cfg, run_dir, engine, sessions, trace_report=report, source=trace_cfg.get("path"))


def replay_specs(cfg, run_dir: str | Path, engine, specs: list[RequestSpec], **options) -> dict:
    """Replay specs on the engine, record and write the run (options: _replay_specs'). The engine and the
    specs, then the run's records while they are written, are frozen out of the garbage collector's
    full collections (experiments.frozen_gc)."""
    with frozen_gc():
        return _replay_specs(cfg, run_dir, engine, specs, **options)


def _replay_specs(
    cfg,
    run_dir: str | Path,
    engine,
    specs: list[RequestSpec],
    *,
    trace_report: dict | None = None,
    source: str | None = None,
    temperature: float | None = None,
    quiet: bool = False,
    recorder: Recorder | None = None,
) -> dict:
    run_dir = Path(run_dir)
    replay_cfg = config_value(cfg, "replay", {}) or {}
    mode = replay_cfg.get("name", "offline")
    if mode not in (*MODES, "sessions"):
        raise ValueError(f"replay.name: unknown replay mode {mode!r}; one of {list(MODES)}")
    slo = check_slo(config_value(cfg, "slo"))
    percentiles = list(config_value(cfg, "metrics.percentiles", DEFAULT_PERCENTILES) or DEFAULT_PERCENTILES)
    resolved = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    experiment = config_value(cfg, "experiment", "default")
    hydra = _hydra_info()

    recorder = (recorder or Recorder()).attach(engine)
    # the prefix cache's block-access stream (experiments.kv_whatif): paged caches only
    access_log = engine.kv.start_access_log() if config_value(cfg, "metrics.kv_access_log", False) else None
    wandb = WandbLogger(config_value(cfg, "wandb"), run_dir, resolved, name=run_dir.name, group=experiment)
    if wandb.run is not None:  # step rows only for a listener that uses them (a simulation's runs stay whole)
        recorder.listeners.append(wandb.log_step)
    bar = tqdm(
        total=len(specs),
        unit="req",
        desc=f"{experiment} [{mode}]",
        dynamic_ncols=True,
        mininterval=0.5,
        disable=quiet or not config_value(cfg, "progress", True),
        file=sys.stderr,
    )

    def on_step(row):
        if row["step"] % 8 == 0:
            bar.set_postfix(run=row["num_running"], wait=row["num_waiting"], kv=f"{row['kv_usage']:.0%}", refresh=False)

    if not bar.disable:
        recorder.listeners.append(on_step)
    replay = (SessionReplay if mode == "sessions" else Replay).of_engine(
        engine,
        recorder,
        **session_options(replay_cfg, mode),
        temperature=replay_cfg.get("temperature", 0.0) if temperature is None else temperature,
        max_duration_s=_positive(replay_cfg.get("max_duration_s"), "replay.max_duration_s"),
        on_finish=lambda _row: bar.update(1),
        sleep=engine.executor_kind.sleep,  # a simulation's idle time is virtual
        source=source,
    )
    with StopSignals() as stops:
        # in run.log (Hydra's job log): from here a stop signal keeps what was measured
        logging.getLogger(__name__).info("replaying %d requests (%s) into %s", len(specs), mode, run_dir)
        try:
            interrupted, error = drive(replay, specs, mode, replay_cfg.get("concurrency"), stops)
        finally:
            bar.close()
            recorder.detach()
            if access_log is not None:
                engine.kv.stop_access_log()

        gc.freeze()  # the run's records: alive until written (experiments.frozen_gc)
        start = replay.start_time if replay.start_time is not None else engine.clock()
        end = replay.end_time if replay.end_time is not None else start
        requests, steps = recorder.requests_frame(), recorder.steps_frame()
        summary = run_summary(
            requests, steps, start, end, replay, experiment, mode, trace_report, len(specs), stops, interrupted, error,
            slo, percentiles, cfg, resolved,
        )  # fmt: skip
        summary.update(spec_summary(engine))
        summary.update(executor_summary(engine))
        summary.update(kv_reuse_summary(engine))
        tables = {} if access_log is None else {ACCESS_FILE: access_frame(access_log)}
        tables.update(session_tables(replay, requests, summary, len(specs)))
        readings = recorded_readings(engine.clock)
        write_run(
            run_dir,
            config_yaml=OmegaConf.to_yaml(OmegaConf.create(resolved)),
            requests=requests,
            steps=steps,
            summary=summary,
            trace_report=trace_report,
            clock=None if readings is None else pd.DataFrame({"t": readings}),
            tables=tables,
        )
        _mark_late_signal(summary, stops, run_dir)  # a signal during the write: the summary says so
        append_run_row(cfg, run_dir, summary, hydra, SWEEP_COLUMNS)
        wandb.finish(summary, requests, exit_code=1 if interrupted else 0)
        _mark_late_signal(summary, stops, run_dir)
    if not quiet:
        print_summary(summary, engine, run_dir)
    if error is not None:
        raise error
    if interrupted or stops.hits:
        raise RunInterrupted(stops.hits[0] if stops.hits else signal.SIGINT)
    return summary


def session_options(replay_cfg: dict, mode: str) -> dict:
    """The session driver's length caps (replay=sessions); nothing for the other modes."""
    if mode != "sessions":
        return {}
    return {
        "max_prompt_tokens": _positive(replay_cfg.get("max_prompt_tokens"), "replay.max_prompt_tokens", True),
        "max_output_tokens": _positive(replay_cfg.get("max_output_tokens"), "replay.max_output_tokens", True),
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
    requests, steps, start, end, replay, experiment, mode, trace_report, num_requests, stops, interrupted, error,
    slo, percentiles, cfg, resolved,
) -> dict:  # fmt: skip
    """The summary of a replay (one engine or a cluster): the serving metrics, how the run went, and which
    configuration it repeats with which seeds (experiments.aggregate)."""
    summary = summarize(requests, steps, start, end, slo, percentiles)
    summary.update(
        {
            "experiment": experiment,
            "replay": mode,
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


def recorded_readings(clock) -> list[float] | None:
    """The clock readings of a run whose clock was recorded (build_engine: the real engine); else None."""
    from testbed.sim.clock import RecordingClock

    return clock.readings if isinstance(clock, RecordingClock) else None


def executor_summary(engine) -> dict:
    """What ran the steps: `executor` real | host | sim and the kernel, and the keys its kind adds (a
    simulation: its cost model's identity and the simulated seconds, as sim_* keys)."""
    kind = engine.executor_kind
    return {"executor": engine.config.executor, "kernel": engine.kernel, **kind.summary(engine.executor)}


def spec_summary(engine) -> dict:
    """Speculative decoding counters (testbed.spec) as flat spec_* keys; empty without speculation."""
    stats = getattr(engine, "spec_stats", None) or {}
    return {f"spec_{k}": v for k, v in stats.items()}


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)
