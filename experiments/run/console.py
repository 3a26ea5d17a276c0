"""The run's summary as a table on the console (a simulated run says so in its title)."""

from pathlib import Path

from rich.console import Console
from rich.table import Table


def print_summary(summary: dict, engine, run_dir: Path, console: Console | None = None) -> None:
    from testbed.executor_kinds import executor_kind

    cfg = engine.config
    if executor_kind(cfg.executor.name).simulated:  # a simulated figure says so, and what priced it
        ran_on = f"SIMULATED: {summary.get('sim_cost_model')} {summary.get('sim_device') or ''}".rstrip()
    else:
        ran_on = f"kernel={engine.kernel} | device={engine.device}"
    title = (
        f"{engine.model_name} | {ran_on} | scheduler={cfg.scheduler.name} | block_size={cfg.cache.block_size}"
        f" | replay={summary.get('replay')}"
    )
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")

    def ms(key):
        return f"{summary[key]:.0f} ms"

    state = (
        " (interrupted)"
        if summary.get("interrupted")
        else " (failed)"
        if summary.get("error")
        else " (timed out)"
        if summary.get("timed_out")
        else ""
    )
    rows = [
        ("requests completed", f"{summary['completed']} / {summary['num_requests']}{state}"),
        ("input / output tokens", f"{summary['total_input_tokens']} / {summary['total_output_tokens']}"),
        ("duration", f"{summary['duration']:.2f} s"),
        ("request throughput", f"{summary['request_throughput']:.2f} req/s"),
        ("output throughput", f"{summary['output_throughput']:.1f} tok/s"),
        ("total token throughput", f"{summary['total_token_throughput']:.1f} tok/s"),
        ("TTFT mean / median / p99", f"{ms('mean_ttft_ms')} / {ms('median_ttft_ms')} / {ms('p99_ttft_ms')}"),
        ("TPOT mean / p99", f"{ms('mean_tpot_ms')} / {ms('p99_tpot_ms')}"),
        ("ITL mean / p99", f"{ms('mean_itl_ms')} / {ms('p99_itl_ms')}"),
        ("E2E latency mean / p99", f"{ms('mean_e2el_ms')} / {ms('p99_e2el_ms')}"),
    ]
    if summary.get("request_goodput") is not None:
        rows.append(
            ("goodput (SLO attainment)", f"{summary['request_goodput']:.2f} req/s ({summary['slo_attainment']:.0%})")
        )
    rows += [
        ("KV utilisation mean / max", f"{summary['kv_utilization_mean']:.1%} / {summary['kv_utilization_max']:.1%}"),
        (
            "fragmentation int / res / ext",
            f"{summary['frag_internal']:.1%} / {summary['frag_reserved']:.1%} / {summary['frag_external']:.1%}",
        ),
        ("prefix-hit rate", f"{summary['prefix_hit_rate']:.1%}"),
        ("preemptions", f"{summary['num_preemptions']}"),
        ("steps (mean batch)", f"{summary['num_steps']} ({summary['mean_batch_size']:.1f})"),
    ]
    if summary.get("spec_method"):
        rows.append(
            (
                f"spec={summary['spec_method']}: acceptance / mean accepted length",
                f"{summary['spec_acceptance_rate']:.1%} / {summary['spec_mean_accepted_length']:.2f}",
            )
        )
    for row in rows:
        table.add_row(*row)
    console = console or Console()
    console.print(table)
    console.print(f"results: {run_dir}")
