"""A trace replayed through a cluster of replicas: `python run.py cluster.replicas=N ...` (and P/D).

    python run.py executor=sim device=h100-sxm model=llama-3.1-8b trace=azure replay=open_loop \\
        cluster.replicas=8 cluster.router=prefix_affinity          # simulated: N engines, one virtual clock
    python run.py model=smollm2-135m kernel=cpu trace=azure cluster.replicas=2   # real: one process each

The same result files as a single-engine run (experiments.results.files), with the cluster's columns and keys
(experiments.cluster.recording), through the same run path (experiments.run.replay_run): signal handling
(partial results kept, summary says so) and W&B (config, summary, requests table; no per-step series:
the replicas' step counters interleave and W&B needs one increasing step).
"""

from __future__ import annotations

import gc
from pathlib import Path

from rich.console import Console
from rich.table import Table

from experiments.cluster.recording import ClusterRecorder, cluster_summary
from experiments.replay.driver import Replay
from experiments.results.metrics import check_slo
from experiments.run.console import print_summary
from experiments.run.frozen_gc import frozen_gc
from experiments.run.huge_pages import numpy_small_pages
from experiments.run.replay_run import (
    config_value,
    drive,
    end_run,
    run_setup,
    run_summary,
    session_tables,
    write_results,
)
from experiments.run.runner import (
    SWEEP_COLUMNS,
    check_session_config,
    executor_summary,
    load_replay_specs,
    spec_summary,
    trace_vocab_size,
)
from experiments.run.stop_signals import StopSignals
from experiments.sessions import Session, is_session_trace, load_sessions, session_report
from experiments.sessions.replay import SessionReplay
from experiments.traces import RequestSpec
from testbed.cluster.config import ClusterConfig

CLUSTER_SWEEP_COLUMNS = (
    "cluster.replicas",
    "cluster.router",
    "cluster.prefill_replicas",
    "cluster.decode_replicas",
    "cluster.decode_router",
)


def build_cluster(cfg, cluster_cfg: ClusterConfig):
    """(cluster, engines or None, a replica engine or model spec for the trace loader)."""
    from experiments.run.engine_config import engine_config_from_cfg
    from testbed.executor_kinds import executor_kind

    config = engine_config_from_cfg(cfg)
    if executor_kind(config.executor.name).simulated:
        from testbed.cluster.build import build_simulated_cluster

        simulated = build_simulated_cluster(config, cluster_cfg)
        engines = [r.engine for r in simulated.replicas]
        return simulated, engines, engines[0]
    if config.executor.name == "real":
        if cluster_cfg.disaggregated:
            raise ValueError(
                "P/D disaggregation runs on the simulator (executor=sim); real replicas share no KV transport"
            )
        from experiments.cluster.processes import ProcessCluster

        processes = ProcessCluster(config, cluster_cfg)
        return processes, None, processes.model
    raise ValueError(
        f"a cluster runs executor=sim (simulated) or executor=real (processes), not {config.executor.name!r}"
    )


def run_cluster(cfg, run_dir: str | Path, quiet: bool = False) -> dict:
    """Replay cfg.trace through the cluster of cfg.cluster; returns the summary (also in summary.json).
    With replay.repeats > 1: each repeat in run_dir/repeat<i>/ (experiments.run.repeats)."""
    from experiments.run.repeats import repeat_count, run_repeats

    if repeat_count(cfg) > 1 and config_value(cfg, "replay.repeat") is None:
        return run_repeats(cfg, run_dir, run_one=lambda c, d: run_cluster(c, d, quiet))
    cluster_cfg = ClusterConfig.from_any(config_value(cfg, "cluster"))
    trace_cfg = config_value(cfg, "trace")
    if not trace_cfg:
        raise ValueError("a cluster replays a trace: trace=azure|mooncake|burstgpt|sharegpt|synthetic")
    check_slo(config_value(cfg, "slo"))
    sessions = config_value(cfg, "replay.name") == "sessions" or is_session_trace(trace_cfg)
    if sessions:
        check_session_config(cfg, trace_cfg)
    cluster, engines, model = build_cluster(cfg, cluster_cfg)
    try:
        if sessions:
            items = load_sessions(
                trace_cfg,
                vocab_size=trace_vocab_size(model),
                max_model_len=model.max_model_len,
                tokenizer=getattr(model, "tokenizer", None),
            )
            report = {"format": trace_cfg.get("name"), "path": trace_cfg.get("path"), **session_report(items)}
            return replay_cluster(
                cfg, run_dir, cluster, engines, cluster_cfg, items, trace_report=report, source=trace_cfg.get("path"),
                quiet=quiet, max_model_len=model.max_model_len,
            )  # fmt: skip
        specs, report = load_replay_specs(cfg, trace_cfg, model)
        return replay_cluster(
            cfg,
            run_dir,
            cluster,
            engines,
            cluster_cfg,
            specs,
            trace_report=report,
            source=report.get("path"),
            quiet=quiet,
        )
    finally:
        close = getattr(cluster, "close", None)
        if close is not None:
            close()


def replay_cluster(
    cfg,
    run_dir: str | Path,
    cluster,
    engines,
    cluster_cfg: ClusterConfig,
    specs: list[RequestSpec] | list[Session],  # sessions with replay=sessions
    *,
    trace_report: dict | None = None,
    source: str | None = None,
    quiet: bool = False,
    max_model_len: int | None = None,
) -> dict:
    roles = cluster.roles
    setup = run_setup(cfg, run_dir, len(specs), desc=f", {len(roles)} replicas", quiet=quiet)
    recorder = ClusterRecorder(roles, cluster_cfg.disaggregated)
    if engines is not None:
        recorder.attach_all(engines)
    options = setup.replay_options(source)
    if setup.mode == "sessions":  # specs are experiments.sessions.Session
        options["max_model_len"] = max_model_len
    replay = (SessionReplay if setup.mode == "sessions" else Replay)(
        cluster, recorder, **options, temperature=setup.replay_cfg.get("temperature", 0.0)
    )
    # the replicas and specs, then the run's records while they are written, out of the garbage
    # collector's way (experiments.run.frozen_gc), numpy's arrays on small pages (experiments.run.huge_pages),
    # as for one engine (experiments.run.runner.replay_specs)
    with frozen_gc(), numpy_small_pages(), StopSignals() as stops:
        try:
            interrupted, error = drive(replay, specs, setup.mode, setup.replay_cfg.get("concurrency"), stops)
        finally:
            setup.bar.close()
            recorder.detach()
        collect = getattr(cluster, "collect_steps", None)  # replica processes send their step rows at the end
        if collect is not None:
            for index, rows in collect().items():
                recorder.add_step_rows(index, rows)
        gc.freeze()  # the run's records: alive until written

        start = replay.start_time if replay.start_time is not None else cluster.now
        end = replay.end_time if replay.end_time is not None else start
        requests, steps = recorder.requests_frame(), recorder.steps_frame()
        summary = run_summary(
            cfg, setup, requests, steps, start, end, replay, trace_report, len(specs), stops, interrupted, error
        )
        summary.update(cluster_summary(requests, steps, start, end, roles, setup.slo, setup.percentiles))
        summary.update(cluster.identity())
        tables = session_tables(replay, requests, summary, len(specs))
        if engines is not None:
            summary.update(spec_summary(engines[0]))
            summary.update(executor_summary(engines[0]))
            if engines[0].executor_kind.simulated:  # the whole cluster's simulated work, not replica 0's
                summary["sim_simulated_seconds"] = cluster.simulated_seconds
                summary["sim_steps"] = sum(e.executor.num_steps for e in engines)
        else:  # replica processes: what they resolved kernel=auto to
            summary["executor"], summary["kernel"] = "real", cluster.description.kernel
        write_results(
            cfg, setup, stops, summary, requests, steps, trace_report=trace_report, tables=tables,
            columns=SWEEP_COLUMNS + CLUSTER_SWEEP_COLUMNS,
        )  # fmt: skip
    if not quiet:
        print_summary(summary, engines[0] if engines is not None else cluster.description, setup.run_dir)
        print_cluster(summary)
    return end_run(summary, stops, interrupted, error)


def print_cluster(summary: dict, console: Console | None = None) -> None:
    simulated = "SIMULATED " if summary.get("executor") == "sim" else ""
    title = (
        f"{simulated}cluster: {summary['cluster_replicas']} replicas, router={summary.get('cluster_router')}"
        f" | requests CV {summary['replica_request_cv']:.2f} | tokens CV {summary['replica_token_cv']:.2f}"
        f" | prefix hits {summary['cluster_prefix_hit_rate']:.1%}"
    )
    table = Table(title=title)
    for col in ("replica", "role", "requests", "tokens", "prefix hits", "goodput (req/s)"):
        table.add_column(col, justify="right")
    for i, role in enumerate(summary["replica_roles"]):
        goodput = summary["replica_goodput"][i]
        table.add_row(
            str(i),
            role,
            str(summary["replica_requests"][i]),
            str(summary["replica_tokens"][i]),
            f"{summary['replica_prefix_hit_rate'][i]:.1%}",
            "-" if goodput is None else f"{goodput:.2f}",
        )
    console = console or Console()
    console.print(table)
    if "kv_transfers" in summary:
        console.print(
            f"KV transfers: {summary['kv_transfers']}, {summary['kv_transfer_bytes_total'] / 2**30:.2f} GiB, "
            f"mean {summary['mean_kv_transfer_ms']:.2f} ms (p99 {summary['p99_kv_transfer_ms']:.2f} ms), "
            f"mean wait {summary['mean_kv_transfer_wait_ms']:.2f} ms"
        )
