"""What-if (SIMULATED): goodput of llama-3.1-8b on an H100 SXM under the Azure conversation trace, over
scheduler.max_num_batched_tokens x scheduler.max_num_seqs, the question a simulator is for.

    python -m experiments.studies.whatif_batching                  # -> results/fidelity/whatif_batching.{csv,md}

Every figure is simulated (executor=sim, the roofline cost model with conf/device/h100-sxm.yaml); nothing
here was measured on an H100. Each configuration replays --windows disjoint windows of the trace (window i
= requests [i * n, (i + 1) * n)), open loop at the trace's own arrival times divided by --time-scale (5:
near the simulated capacity of the default config); the interval is the Student t interval of the mean
over windows (the "seeds" of the sweep: a simulation of one window is deterministic). Goodput counts
requests meeting the SLO (--slo-ttft-ms, --slo-tpot-ms). The trace is /work/shared/traces' full copy when
present, else the shipped 1,000-request sample (then fewer, shorter windows fit).
"""

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import pandas as pd

from experiments.results.atomic import atomic_write_text
from experiments.results.environment import markdown_table
from experiments.run.runner import run_trace
from experiments.statistics.aggregate import within_range
from experiments.statistics.intervals import t_interval
from experiments.studies.fidelity import compose
from experiments.studies.fidelity_plan import SHARED, shared_traces

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "fidelity"
METRICS = ("request_goodput", "slo_attainment", "request_throughput", "p99_ttft_ms", "median_tpot_ms")


def trace_path() -> Path:
    shared = shared_traces() / SHARED["azure"]
    return shared if shared.exists() else ROOT / "experiments" / "data" / "azure_llm_2023_conv_sample.csv"


def run(tokens: int, seqs: int, window: int, args, folder: Path) -> dict:
    cfg = compose(
        [
            "model=llama-3.1-8b",
            "executor=sim",
            "device=h100-sxm",
            "trace=azure",
            f"trace.path={trace_path()}",
            f"trace.start={window * args.requests}",
            f"trace.max_requests={args.requests}",
            f"trace.time_scale={args.time_scale}",
            "replay=open_loop",
            f"scheduler.max_num_batched_tokens={tokens}",
            f"scheduler.max_num_seqs={seqs}",
            f"slo.ttft_ms={args.slo_ttft_ms}",
            f"slo.tpot_ms={args.slo_tpot_ms}",
            *args.overrides,
        ]
    )
    summary = run_trace(cfg, folder / f"t{tokens}-s{seqs}-w{window}")
    return {
        "max_num_batched_tokens": tokens,
        "max_num_seqs": seqs,
        "window": window,
        **{m: summary[m] for m in METRICS},
    }


def table(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (tokens, seqs), g in runs.groupby(["max_num_batched_tokens", "max_num_seqs"]):
        row = {"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "windows": len(g)}
        for m in METRICS:
            lo, hi = within_range(m, *t_interval(g[m]))
            row |= {m: g[m].mean(), f"{m}_ci_low": lo, f"{m}_ci_high": hi}
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--tokens", nargs="+", type=int, default=[512, 2048, 8192], help="max_num_batched_tokens")
    p.add_argument("--seqs", nargs="+", type=int, default=[32, 128, 256], help="max_num_seqs")
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--requests", type=int, default=400, help="requests per window")
    p.add_argument("--time-scale", type=float, default=5.0)
    p.add_argument("--slo-ttft-ms", type=float, default=1000)
    p.add_argument("--slo-tpot-ms", type=float, default=50)
    args, overrides = p.parse_known_args(argv)
    args.overrides = overrides
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tokens, seqs, window in itertools.product(args.tokens, args.seqs, range(args.windows)):
            rows.append(run(tokens, seqs, window, args, Path(tmp)))
            print(
                f"tokens={tokens} seqs={seqs} window={window}: goodput {rows[-1]['request_goodput']:.3g}",
                file=sys.stderr,
            )
    runs = pd.DataFrame(rows)
    result = table(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "whatif_batching_runs.csv", runs.to_csv(index=False))
    atomic_write_text(args.out / "whatif_batching.csv", result.to_csv(index=False))
    fmt = lambda r, m, f: f"{r[m]:{f}} [{r[m + '_ci_low']:{f}}, {r[m + '_ci_high']:{f}}]"
    lines = [
        "SIMULATED (executor=sim, roofline, conf/device/h100-sxm.yaml): llama-3.1-8b, Azure conversation trace "
        f"({trace_path().name}), {args.windows} windows of {args.requests} requests, arrivals / {args.time_scale:g}, "
        f"SLO TTFT <= {args.slo_ttft_ms:g} ms and TPOT <= {args.slo_tpot_ms:g} ms; mean [95% t interval over windows].",
        "",
        markdown_table(
            [
                "max_num_batched_tokens",
                "max_num_seqs",
                "goodput (req/s)",
                "SLO attainment",
                "p99 TTFT (ms)",
                "median TPOT (ms)",
            ],
            [
                [
                    r["max_num_batched_tokens"],
                    r["max_num_seqs"],
                    fmt(r, "request_goodput", ".2f"),
                    fmt(r, "slo_attainment", ".3f"),
                    fmt(r, "p99_ttft_ms", ".0f"),
                    fmt(r, "median_tpot_ms", ".1f"),
                ]
                for r in result.to_dict("records")
            ],
        ),
    ]
    atomic_write_text(args.out / "whatif_batching.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return args.out


if __name__ == "__main__":
    main()
