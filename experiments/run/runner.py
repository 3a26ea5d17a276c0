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
from pathlib import Path

import pandas as pd

from experiments.kv_whatif.stream import FILE as ACCESS_FILE
from experiments.kv_whatif.stream import access_table
from experiments.replay.driver import Replay
from experiments.results.kv_metrics import kv_reuse_summary
from experiments.results.metrics import check_slo
from experiments.results.recorder import Recorder
from experiments.run.console import print_summary
from experiments.run.frozen_gc import frozen_gc
from experiments.run.huge_pages import numpy_small_pages
from experiments.run.replay_run import (
    config_value,
    drive,
    end_run,
    positive,
    run_setup,
    run_summary,
    session_tables,
    write_results,
)
from experiments.run.stop_signals import StopSignals
from experiments.sessions import Session, is_session_trace, load_sessions, session_report
from experiments.sessions.replay import SessionReplay
from experiments.traces import RequestSpec, load_trace

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
def apply_length_policy(specs: list[RequestSpec], replay_cfg) -> tuple[list[RequestSpec], dict]:
    """The replay's length policy, applied after the trace's own (max_model_len) policy:

    lengths are multiplied by replay.length_scale (rounded up, at least 1), then capped at
    replay.max_prompt_tokens / replay.max_output_tokens. A shortened prompt keeps its first tokens, so
    shared prefixes (Mooncake hash blocks, system prompts) survive. Every change is counted."""
    scale = positive(config_value(replay_cfg, "length_scale", 1.0), "replay.length_scale")
    max_p = positive(config_value(replay_cfg, "max_prompt_tokens"), "replay.max_prompt_tokens", integer=True)
    max_o = positive(config_value(replay_cfg, "max_output_tokens"), "replay.max_output_tokens", integer=True)
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


# ---- entry points ---------------------------------------------------------------------------------
def build_engine(cfg, record_clock: bool = True):
    """The engine of a run. A real run records every reading of its clock (clock.parquet), so that a
    simulation of the same trace and config can replay it (executor=sim executor.cost_model=replay_steps)."""
    from experiments.run.engine_config import engine_config_from_cfg
    from testbed import Engine
    from testbed.executor_kinds import executor_kind
    from testbed.sim.clock import RecordingClock

    config = engine_config_from_cfg(cfg)
    clock = RecordingClock() if record_clock and executor_kind(config.executor.name).records_clock else None
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
    With replay.repeats > 1 or replay.warmup_runs > 0: each repeat in run_dir/repeat<i>/ (experiments.run.repeats);
    one given repeat (replay.repeat set) with replay.warmup_runs > 0: the warm-ups first, in run_dir/warmup<k>/."""
    from experiments.run.repeats import repeat_count, run_after_warmup, run_repeats, warmup_count

    repeated = repeat_count(cfg) > 1 or warmup_count(cfg) > 0
    if repeated and config_value(cfg, "replay.repeat") is None:
        return run_repeats(cfg, run_dir, engine)
    if warmup_count(cfg) > 0:
        return run_after_warmup(cfg, run_dir, engine)
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
    specs, report = load_replay_specs(cfg, trace_cfg, engine)
    return replay_specs(cfg, run_dir, engine, specs, trace_report=report, source=report.get("path"))


def load_replay_specs(cfg, trace_cfg, model) -> tuple[list[RequestSpec], dict]:
    """The trace's requests for `model` (an engine, or a cluster's model: vocabulary, max_model_len and
    tokenizer) after the replay's length policy, and the trace report with that policy's report. The
    prompts made meanwhile are kept out of full collections (experiments.run.frozen_gc: each would walk
    every token made so far; half the load's time in a 10,000-request Azure trace)."""
    with frozen_gc():
        trace = load_trace(
            trace_cfg,
            vocab_size=trace_vocab_size(model),
            max_model_len=model.max_model_len,
            tokenizer=getattr(model, "tokenizer", None),
        )
        specs, length_report = apply_length_policy(trace.requests, config_value(cfg, "replay", {}))
    return specs, {**trace.report, "replay_length_policy": length_report}


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
    with frozen_gc():  # as load_replay_specs
        sessions = load_sessions(
            trace_cfg,
            vocab_size=trace_vocab_size(engine),
            max_model_len=engine.max_model_len,
            tokenizer=getattr(engine, "tokenizer", None),
        )
    report = {"format": trace_cfg.get("name"), "path": trace_cfg.get("path"), **session_report(sessions)}
    return replay_specs(cfg, run_dir, engine, sessions, trace_report=report, source=trace_cfg.get("path"))


def replay_specs(cfg, run_dir: str | Path, engine, specs: list[RequestSpec] | list[Session], **options) -> dict:
    """Replay specs on the engine, record and write the run (options: _replay_specs'). The engine and the
    specs, then the run's records while they are written, are frozen out of the garbage collector's
    full collections (experiments.run.frozen_gc); numpy advises no huge pages meanwhile
    (experiments.run.huge_pages)."""
    with frozen_gc(), numpy_small_pages():
        return _replay_specs(cfg, run_dir, engine, specs, **options)


def _replay_specs(
    cfg,
    run_dir: str | Path,
    engine,
    specs: list[RequestSpec] | list[Session],  # sessions with replay=sessions
    *,
    trace_report: dict | None = None,
    source: str | None = None,
    temperature: float | None = None,
    quiet: bool = False,
    recorder: Recorder | None = None,
) -> dict:
    setup = run_setup(cfg, run_dir, len(specs), quiet=quiet)
    recorder = (recorder or Recorder()).attach(engine)
    # the prefix cache's block-access stream (experiments.kv_whatif): paged caches only
    access_log = engine.kv.start_access_log() if config_value(cfg, "metrics.kv_access_log", False) else None
    if setup.wandb.run is not None:  # step rows only for a listener that uses them (a simulation's runs stay whole)
        recorder.listeners.append(setup.wandb.log_step)
    bar = setup.bar

    def on_step(row):
        if row["step"] % 8 == 0:
            bar.set_postfix(run=row["num_running"], wait=row["num_waiting"], kv=f"{row['kv_usage']:.0%}", refresh=False)

    if not bar.disable:
        recorder.listeners.append(on_step)
    replay = (SessionReplay if setup.mode == "sessions" else Replay).of_engine(
        engine,
        recorder,
        **setup.replay_options(source),
        temperature=setup.replay_cfg.get("temperature", 0.0) if temperature is None else temperature,
        sleep=engine.executor_kind.sleep,  # a simulation's idle time is virtual
    )
    with StopSignals() as stops:
        # in run.log (Hydra's job log): from here a stop signal keeps what was measured
        logging.getLogger(__name__).info("replaying %d requests (%s) into %s", len(specs), setup.mode, setup.run_dir)
        try:
            interrupted, error = drive(replay, specs, setup.mode, setup.replay_cfg.get("concurrency"), stops)
        finally:
            bar.close()
            recorder.detach()
            if access_log is not None:
                engine.kv.stop_access_log()

        gc.freeze()  # the run's records: alive until written (experiments.run.frozen_gc)
        start = replay.start_time if replay.start_time is not None else engine.clock()
        end = replay.end_time if replay.end_time is not None else start
        requests, steps = recorder.requests_frame(), recorder.steps_frame()
        summary = run_summary(
            cfg, setup, requests, steps, start, end, replay, trace_report, len(specs), stops, interrupted, error
        )
        summary.update(spec_summary(engine))
        summary.update(executor_summary(engine))
        summary.update(kv_reuse_summary(engine))
        tables = {} if access_log is None else {ACCESS_FILE: access_table(access_log)}
        tables.update(session_tables(replay, requests, summary, len(specs)))
        readings = recorded_readings(engine.clock)
        clock = None if readings is None else pd.DataFrame({"t": readings})
        write_results(
            cfg, setup, stops, summary, requests, steps, trace_report=trace_report, tables=tables,
            columns=SWEEP_COLUMNS, clock=clock,
        )  # fmt: skip
    if not quiet:
        print_summary(summary, engine, setup.run_dir)
    return end_run(summary, stops, interrupted, error)


def recorded_readings(clock) -> list[float] | None:
    """The clock readings of a run whose clock was recorded (build_engine: the real engine); else None."""
    from testbed.sim.clock import RecordingClock

    return clock.readings if isinstance(clock, RecordingClock) else None


def executor_summary(engine) -> dict:
    """What ran the steps: `executor` real | host | sim and the kernel, and the keys its kind adds (a
    simulation: its cost model's identity and the simulated seconds, as sim_* keys)."""
    kind = engine.executor_kind
    return {"executor": engine.config.executor.name, "kernel": engine.kernel, **kind.summary(engine.executor)}


def spec_summary(engine) -> dict:
    """Speculative decoding counters (testbed.spec) as flat spec_* keys; empty without speculation."""
    stats = getattr(engine, "spec_stats", None) or {}
    return {f"spec_{k}": v for k, v in stats.items()}
