"""How far the simulator is from the real engine on work it was not calibrated on.

    python -m experiments.studies.fidelity --profile results/profiles/<profile>.json   # -> results/fidelity/

For each held-out workload (Azure conversation open loop, Mooncake closed loop, a synthetic open-loop rate
sweep; none of them used by experiments.calibrate), the real engine runs it (the profile's model and kernel
on this CPU), then the simulator runs the same trace and config with executor.cost_model=profile. Reported:
the relative error of output throughput, median and p90 TTFT, median TPOT and median E2EL (sim vs real),
and every real step's period against the profile's prediction for the same batch shape. Writes
fidelity.csv, step_residuals.csv, summary.md and two plots (predicted vs measured step time; TTFT CDFs).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

from benchmarks.common import environment, markdown_table
from experiments.runner import build_engine, run_trace
from experiments.step_shapes import StepShapes
from testbed.sim.cost_models.profile import ProfileCost

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "fidelity"
METRICS = ("output_throughput", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "median_e2el_ms")
SYNTHETIC = [
    "trace=synthetic",
    "~trace.prompt_len",
    "+trace.prompt_len={dist:uniform,low:32,high:256}",
    "~trace.output_len",
    "+trace.output_len={dist:uniform,low:16,high:64}",
]


def workloads(scale: float) -> dict[str, list[str]]:
    """Held-out workloads, CPU-sized; `scale` multiplies request counts (0.25 for a smoke run)."""
    n = lambda k: max(4, int(k * scale))
    out = {
        "azure_open_loop": [
            "trace=azure",
            f"trace.max_requests={n(80)}",
            "trace.time_scale=0.25",
            "replay=open_loop",
            "replay.length_scale=0.0625",
            "replay.max_prompt_tokens=256",
            "replay.max_output_tokens=48",
        ],
        "mooncake_closed_loop": [
            "trace=mooncake",
            f"trace.max_requests={n(48)}",
            "replay=closed_loop",
            "replay.concurrency=8",
            "replay.length_scale=0.02",
            "replay.max_prompt_tokens=384",
            "replay.max_output_tokens=48",
        ],
    }
    for rate in (0.5, 1.0, 2.0):
        out[f"synthetic_rate_{rate:g}"] = [
            *SYNTHETIC,
            f"trace.num_requests={n(40)}",
            f"trace.rate={rate}",
            "replay=open_loop",
        ]
    return out


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=["progress=false", "wandb.enabled=false", *overrides])


def run_pair(name: str, engine_overrides: list[str], workload: list[str], profile: Path, runs: Path):
    """(real summary, sim summary, real requests, sim requests, step residual rows) of one workload."""
    cfg = compose([*engine_overrides, *workload])
    engine = build_engine(cfg, record_clock=False)
    cost = ProfileCost(profile, engine.model_name, engine.kernel, str(engine.dtype).removeprefix("torch."))
    with StepShapes(engine) as shapes:
        real = run_trace(cfg, runs / name / "real", engine)
    periods = shapes.periods()
    # only periods the engine spent working: after an idle step the driver waited for the next arrival
    residuals = [
        {"workload": name, "measured_s": t, "predicted_s": cost.step_time(s)}
        for s, t, busy in zip(shapes.shapes, periods, shapes.busy)
        if busy
    ]
    sim_cfg = compose(
        [*engine_overrides, *workload, "executor=sim", "executor.cost_model=profile", f"executor.profile={profile}"]
    )
    sim = run_trace(sim_cfg, runs / name / "sim")
    read = lambda kind: pd.read_parquet(runs / name / kind / "requests.parquet")
    return real, sim, read("real"), read("sim"), residuals


def relative(sim: float, real: float) -> float:
    return (sim - real) / real if real else float("nan")


def plots(residuals: pd.DataFrame, requests: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for name, group in residuals.groupby("workload"):
        ax.scatter(1e3 * group["measured_s"], 1e3 * group["predicted_s"], s=6, alpha=0.5, label=name)
    top = 1e3 * max(residuals["measured_s"].quantile(0.99), residuals["predicted_s"].max())
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.set(
        xlabel="measured step period (ms)",
        ylabel="profile's prediction (ms)",
        xlim=(0, top),
        ylim=(0, top),
        title="step time: simulated vs measured",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "step_time_pred_vs_measured.png", dpi=120)
    fig, axes = plt.subplots(1, len(requests), figsize=(3.2 * len(requests), 3), sharey=True)
    for ax, (name, (real, sim)) in zip(axes, requests.items()):
        for label, frame in (("real", real), ("sim", sim)):
            ttft = (1e3 * (frame["first_token_time"] - frame["arrival_time"])).sort_values()
            ax.plot(ttft.values, [(i + 1) / len(ttft) for i in range(len(ttft))], label=label)
        ax.set(title=name, xlabel="TTFT (ms)")
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "ttft_cdf_sim_vs_real.png", dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--scale", type=float, default=1.0, help="request counts x this (0.25: smoke run)")
    p.add_argument("--only", nargs="*", help="workload names to run (default: all)")
    args, engine_overrides = p.parse_known_args(argv)
    profile = json.loads(args.profile.read_text())
    engine_overrides = [f"model={profile['model']}", f"kernel={profile['kernel']}", *engine_overrides]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, residuals, requests = [], [], {}
    started = time.perf_counter()
    for name, workload in workloads(args.scale).items():
        if args.only and name not in args.only:
            continue
        real, sim, real_req, sim_req, res = run_pair(name, engine_overrides, workload, args.profile, args.out / "runs")
        residuals += res
        requests[name] = (real_req, sim_req)
        for metric in METRICS:
            rows.append(
                {
                    "workload": name,
                    "metric": metric,
                    "real": real[metric],
                    "sim": sim[metric],
                    "rel_error": relative(sim[metric], real[metric]),
                }
            )
        print(
            f"{name}: "
            + ", ".join(f"{m} {100 * r['rel_error']:+.1f}%" for m, r in zip(METRICS, rows[-5:]))
            + f" ({time.perf_counter() - started:.0f} s so far)",
            file=sys.stderr,
        )
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "fidelity.csv", index=False)
    res = pd.DataFrame(residuals)
    res["rel_error"] = (res["predicted_s"] - res["measured_s"]) / res["measured_s"]
    res.to_csv(args.out / "step_residuals.csv", index=False)
    plots(res, requests, args.out)
    wide = table.pivot(index="workload", columns="metric", values="rel_error")[list(METRICS)]
    lines = [
        f"Simulated (profile `{args.profile.name}`) vs real, relative error (sim - real) / real:",
        "",
        markdown_table(["workload", *METRICS], [[w, *(f"{100 * v:+.1f}%" for v in r)] for w, r in wide.iterrows()]),
        "",
        "Step-time residuals (predicted - measured) / measured over every real step: median "
        f"{100 * res['rel_error'].median():+.1f}%, median |.| {100 * res['rel_error'].abs().median():.1f}%, "
        f"p90 |.| {100 * res['rel_error'].abs().quantile(0.9):.1f}% ({len(res)} steps).",
        "",
        "Environment: " + json.dumps(environment()),
    ]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
