"""How far the simulator is from the real engine where the step cost decides the answer: at and past
saturation, tails as well as medians, against the real engine's own spread.

    python -m experiments.studies.fidelity --profile results/profiles/<profile>.json   # -> results/fidelity/

Per trace (experiments/studies/fidelity_plan.py; default the synthetic generator and the Azure
conversation trace, both held out from calibration): closed loop at concurrency 1/4/16/64 first, whose
most concurrent cell measures the real engine's capacity (mean request throughput), then open loop at
50/80/100/120% of that capacity. Each real run is repeated (--repeats, default 3), every one on a fresh
engine and bracketed by the calibration probe (experiments/calibration/probe.py) on that engine, timed just
before and just after it, so the machine's drift against the profile's own start probe is reported beside
each figure, before / after / their mean (probe, real, probe; probe, real, probe; ...). Each cost model
(--cost-models, default profile and operators) simulates each cell once (the simulation is
deterministic). Written to --out: runs.csv (every run), figures.csv (per cell, cost model and metric: real
mean, 95% interval, simulated value, error, inside the interval, against the issue's targets), knee.csv,
step_residuals.csv (every busy real step, its whole shape, priced by each cost model), residuals_by_kind.csv
(pure decode, prefill chunk, mixed), residuals_by_repeat.csv (the same per real repeat: the runs of a cell
follow different work in this process, repeat 0 the previous cell's simulations, later ones a real run) and
summary.md, which also names the profile's calibration and its self-check. The SLO is the composed config's
`slo` (override slo.ttft_ms=...).

--drift-matched also simulates every real run at the machine speed its probes measured (executor.cost_scale =
the mean of its probes before and after / the mean of the calibration's three probes, and beside it the
probe before alone; experiments/studies/fidelity_drift.py) and writes
drift_matched.csv, knee_matched.csv, probe_gauge.csv, probe_gauge_runs.csv, probe_gauge_segments.csv and
drift_matched.md. The same
tables for a finished study folder: python -m experiments.studies.fidelity_reanalyze FOLDER.
"""

import argparse
import copy
import functools
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from experiments.calibration.probe import probe_seconds
from experiments.calibration.step_shapes import StepShapes
from experiments.results.atomic import atomic_open
from experiments.results.environment import environment
from experiments.run.runner import build_engine, config_value, run_trace
from experiments.studies import fidelity_drift as drift_tables
from experiments.studies import fidelity_report as report
from experiments.studies import probe_gauge as gauge
from experiments.studies.fidelity_plan import TRACES, Cell, cells, native_rate, trace_overrides

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "fidelity"
COST_MODELS = ("profile", "operators")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return hydra_compose("config", overrides=["progress=false", "wandb.enabled=false", *overrides])


def simulate(overrides: list[str], profile: Path, name: str, run_dir: Path, cost_scale: float = 1.0) -> dict:
    """One simulation of a cell's composed overrides with cost model `name`, its prices x cost_scale. A cell's
    simulations differ in cost_scale alone, so it is set on a copy of their config, composed once: a compose
    costs more than a small simulation (the drift-matched ones are most of a study's runs)."""
    cfg = copy.deepcopy(sim_config(tuple(overrides), profile, name))
    cfg.executor.cost_scale = float(cost_scale)
    return run_trace(cfg, run_dir)


@functools.lru_cache(maxsize=4)
def sim_config(overrides: tuple[str, ...], profile: Path, name: str):
    """The composed config of a cell's simulations with cost model `name` (never handed out: copy it)."""
    return compose(
        [
            *overrides,
            "executor=sim",
            f"executor.cost_model={name}",
            f"executor.profile={profile}",
            "executor.allow_extrapolation=true",
        ]
    )


@functools.lru_cache(maxsize=2)
def real_config(overrides: tuple[str, ...]):
    """The composed config of a cell's real runs, which its repeats share (never handed out: copy it)."""
    return compose(list(overrides))


def cost_model(name: str, profile: Path, engine):
    return cost_model_for(name, profile, engine.model_name, engine.kernel, str(engine.dtype).removeprefix("torch."))


def cost_model_for(name: str, profile: Path, model: str, kernel: str, dtype: str):
    """The study's cost model `name` (profile or operators) built from `profile` for this model, kernel and dtype."""
    from testbed.sim.cost_models.operators import OperatorCost
    from testbed.sim.cost_models.profile import ProfileCost

    cls = OperatorCost if name == "operators" else ProfileCost
    return cls(profile, model, kernel, dtype)


class Study:
    def __init__(self, args, engine_overrides: list[str]):
        self.args = args
        self.profile = args.profile
        meta = json.loads(args.profile.read_text())
        if "operators" in args.cost_models and not meta.get("operators"):
            raise SystemExit(
                f"{args.profile} has no operator microbenchmarks (calibrated before they existed, or with "
                "--no-operators): re-calibrate, or pass --cost-models profile"
            )
        check = meta.get("self_check") or {}
        self.reference_probe = (check.get("probe_seconds") or [None])[0]  # the calibration's start probe
        self.matching_probe = drift_tables.reference_probe(meta)  # --drift-matched: the mean of its three
        self.setup = [f"model={meta['model']}", f"kernel={meta['kernel']}"]
        self.user = engine_overrides  # last: the user's overrides win over the cell's (e.g. shorter outputs)
        self.slo = config_value(compose([*self.setup, *self.user]), "slo")  # summary.md's, named after every cell
        self.engine = None  # the last real engine (reads the trace for its native rate)
        self.runs: list[dict] = []
        self.steps: list[dict] = []
        self.started = time.perf_counter()
        self.started_utc = environment()["date"]
        self.calibration = report.calibration_line(meta)

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.started:.0f} s] {msg}", file=sys.stderr)

    def real(self, cell: Cell, overrides: list[str], repeat: int) -> dict:
        cfg = copy.deepcopy(real_config(tuple([*self.setup, *overrides, *self.user])))
        engine = self.engine = build_engine(cfg, record_clock=False)
        probe = probe_seconds(engine, self.args.probe_repeats)
        if self.reference_probe is None:
            self.reference_probe = probe  # no calibration probe in the profile: drift against the first one
        if self.matching_probe is None:
            self.matching_probe = probe
        models = {name: cost_model(name, self.profile, engine) for name in self.args.cost_models}
        with StepShapes(engine) as rec:
            summary = run_trace(cfg, self.args.out / "runs" / cell.name / f"real{repeat}", engine)
        after = probe_seconds(engine, self.args.probe_repeats)  # the pair brackets the run: drift during it shows
        drifts = {
            "drift": probe / self.reference_probe - 1,
            "drift_after": after / self.reference_probe - 1,
            "drift_mean": drift_tables.run_probe(probe, after) / self.reference_probe - 1,
        }
        for shape, period, busy in zip(rec.shapes, rec.periods(), rec.busy):
            if not busy:  # after an idle step the driver waited for the next arrival: not a step's cost
                continue
            kind = report.step_kind(shape.prefill_seqs, shape.decode_seqs)
            for name, model in models.items():
                self.steps.append(
                    {
                        "cell": cell.name,
                        "repeat": repeat,
                        **drifts,
                        "cost_model": name,
                        "kind": kind,
                        "measured_s": period,
                        "predicted_s": model.step_time(shape),
                        **asdict(shape),  # the whole shape: a later fit can be checked on these held-out steps
                    }
                )
        self.log(
            f"{cell.name} real #{repeat}: probe before / after {1e3 * probe:.1f} / {1e3 * after:.1f} ms (drift "
            f"{100 * drifts['drift']:+.1f}% / {100 * drifts['drift_after']:+.1f}%), "
            f"{summary['request_throughput']:.3g} req/s, median TTFT {summary['median_ttft_ms']:.1f} ms"
        )
        return {
            **summary,
            "side": "real",
            "repeat": repeat,
            "cost_model": None,
            "probe_s": probe,
            "probe_after_s": after,
            **drifts,
        }

    def sim(self, cell: Cell, overrides: list[str], name: str) -> dict:
        run_dir = self.args.out / "runs" / cell.name / f"sim-{name}"
        summary = simulate([*self.setup, *overrides, *self.user], self.profile, name, run_dir)
        return {**summary, "side": "sim", "repeat": None, "cost_model": name}

    def matched(self, cell: Cell, overrides: list[str], name: str, real: dict) -> list[dict]:
        """The simulations of one real run at the speed its probes measured (--drift-matched): at the run probe
        (the mean of the probes before and after it; fidelity_drift.run_probe) and, to compare, at the probe
        before it alone."""
        reference = self.matching_probe
        if reference is None:  # set by the first real run at the latest
            raise RuntimeError("drift matching before any real run")
        scales = {
            drift_tables.MATCHED: drift_tables.run_probe(real["probe_s"], real.get("probe_after_s")) / reference,
            drift_tables.MATCHED_BEFORE: real["probe_s"] / reference,
        }
        rows, done = [], {}
        for side, scale in scales.items():
            if scale not in done:  # the same scale twice (no probe after): one simulation
                suffix = "matched" if side == drift_tables.MATCHED else "matched-before"
                run_dir = self.args.out / "runs" / cell.name / f"sim-{name}-{suffix}{real['repeat']}"
                done[scale] = simulate([*self.setup, *overrides, *self.user], self.profile, name, run_dir, scale)
            rows.append(
                {
                    **done[scale],
                    "side": side,
                    "repeat": real["repeat"],
                    "cost_model": name,
                    "probe_s": real["probe_s"],
                    "probe_after_s": real.get("probe_after_s"),
                    "drift": real["drift"],
                    "cost_scale": scale,
                }
            )
        return rows

    def sims(self, cell: Cell, overrides: list[str], real: list[dict]) -> list[dict]:
        rows = [self.sim(cell, overrides, name) for name in self.args.cost_models]
        if self.args.drift_matched:
            rows += [m for r in real for name in self.args.cost_models for m in self.matched(cell, overrides, name, r)]
        return rows

    def cell(self, cell: Cell, overrides: list[str], offered_rate: float | None) -> list[dict]:
        rows = [self.real(cell, overrides, i) for i in range(self.args.repeats)]
        if not self.args.sims_last:
            rows += self.sims(cell, overrides, rows)
        return self.record(cell, offered_rate, rows)

    def record(self, cell: Cell, offered_rate: float | None, rows: list[dict]) -> list[dict]:
        keep = (
            "side",
            "repeat",
            "cost_model",
            "probe_s",
            "probe_after_s",
            "drift",
            "drift_after",
            "drift_mean",
            "cost_scale",
            *report.METRICS,
            "completed",
            "duration",
        )
        out = [
            {
                "cell": cell.name,
                "trace": cell.trace,
                "mode": cell.mode,
                "level": cell.level,
                "offered_rate": offered_rate,
                **{k: r.get(k) for k in keep},
            }
            for r in rows
        ]
        self.runs += out
        self.write()  # after every cell: an interrupted study keeps what it measured
        return out

    def trace(self, trace: str) -> None:
        closed, open_ = cells(trace, self.args.concurrency, self.args.loads, self.args.scale)
        done: list[tuple[Cell, list[str], float | None, list[dict]]] = []
        top = []
        for c in closed:
            rows = self.cell(c, c.overrides(), None)
            top = [r["request_throughput"] for r in rows if r["side"] == "real"]
            done.append((c, c.overrides(), None, rows))
        capacity = sum(top) / len(top)
        self.log(f"{trace}: capacity {capacity:.3g} req/s (real, closed loop c={closed[-1].level:g})")
        native = None
        if trace != "synthetic" and open_:  # the open cells' selection of the trace, at its own speed
            cfg = compose([*self.setup, *trace_overrides(trace, open_[0].num_requests), *self.user])
            native = native_rate(cfg, self.engine)
        for c in open_:
            rows = self.cell(c, c.overrides(capacity, native), c.level * capacity)
            done.append((c, c.overrides(capacity, native), c.level * capacity, rows))
        if self.args.sims_last:  # every real run but the first followed a real run
            for c, overrides, rate, rows in done:
                self.record(c, rate, self.sims(c, overrides, [r for r in rows if r["side"] == "real"]))

    def write(self) -> None:
        out = self.args.out
        runs = pd.DataFrame(self.runs)
        figs = report.figures(runs)
        knee_table = report.knees(runs, self.args.attainment)
        steps = pd.DataFrame(self.steps)
        residuals = report.residuals_by_kind(steps) if len(steps) else pd.DataFrame()
        by_repeat = report.residuals_by_repeat(steps) if len(steps) else pd.DataFrame()
        tables = {
            "runs": runs,
            "figures": figs,
            "knee": knee_table,
            "step_residuals": steps,
            "residuals_by_kind": residuals,
            "residuals_by_repeat": by_repeat,
        }
        reference = self.matching_probe  # set by the first real run when the profile has no probe
        if self.args.drift_matched and reference is not None and (runs["side"] == drift_tables.MATCHED).any():
            tables.update(drift_tables_of(runs, steps, reference, self.args.attainment))
        for name, table in tables.items():
            with atomic_open(out / f"{name}.csv") as f:
                table.to_csv(f, index=False)
        slo = self.slo
        header = (
            f"Fidelity study v2: profile `{self.profile.name}`, {self.args.repeats} real repeats per cell, "
            f"SLO {json.dumps(dict(slo) if slo else None)}, knee at attainment >= {self.args.attainment}. "
            "Simulations price batches beyond the calibrated range too (executor.allow_extrapolation=true).\n\n"
            f"Calibration: {self.calibration}\n\n"
            f"Study started {self.started_utc}, these tables written {environment()['date']} "
            f"({len(self.runs)} runs so far).\n\n"
            "Environment: " + json.dumps(environment())
        )
        with atomic_open(out / "summary.md") as f:
            f.write(report.summary_markdown(figs, knee_table, residuals, header, by_repeat))
        if "drift_matched" in tables:
            write_drift_markdown(out, tables, f"Drift-matched fidelity: {self.calibration}")


def drift_tables_of(runs: pd.DataFrame, steps: pd.DataFrame, reference: float, attainment: float) -> dict:
    per_run = gauge.probe_gauge_runs(steps, runs, reference) if len(steps) else pd.DataFrame()
    return {
        "drift_matched": drift_tables.drift_matched(runs),
        "knee_matched": drift_tables.knee_matched(runs, attainment),
        "probe_gauge_runs": per_run,
        "probe_gauge": gauge.probe_gauge(per_run) if len(per_run) else pd.DataFrame(),
        "probe_gauge_segments": gauge.probe_gauge_segments(steps, runs, reference) if len(steps) else pd.DataFrame(),
    }


def write_drift_markdown(out: Path, tables: dict, header: str) -> None:
    text = drift_tables.markdown(
        tables["drift_matched"],
        tables["knee_matched"],
        tables["probe_gauge"],
        header,
        tables.get("probe_gauge_segments"),
    )
    with atomic_open(out / "drift_matched.md") as f:
        f.write(text)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", type=Path, required=True)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--scale", type=float, default=1.0, help="request counts x this (a smoke run: 0.1)")
    p.add_argument("--repeats", type=int, default=3, help="real runs per cell (>= 2 for an interval)")
    p.add_argument("--traces", nargs="+", default=["synthetic", "azure"], choices=TRACES)
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64], help="closed-loop cells")
    p.add_argument("--loads", nargs="+", type=float, default=[0.5, 0.8, 1.0, 1.2], help="x measured capacity")
    p.add_argument("--cost-models", nargs="+", default=list(COST_MODELS), choices=COST_MODELS)
    p.add_argument("--probe-repeats", type=int, default=3)
    p.add_argument("--attainment", type=float, default=0.9, help="SLO attainment that defines the knee")
    p.add_argument(
        "--sims-last",
        action="store_true",
        help="simulate a trace's cells after all its real runs (default: each cell's after its real runs), so "
        "no real run follows simulations: an A/B of the real engine's speed after either",
    )
    p.add_argument(
        "--drift-matched",
        action="store_true",
        help="also simulate each real run with executor.cost_scale = the mean of its probes before and after / "
        "the calibration's mean probe (the machine's measured speed held fixed), and at its probe before alone: "
        "drift_matched.md and its tables",
    )
    args, overrides = p.parse_known_args(argv)
    if args.repeats < 2:
        p.error("--repeats must be >= 2: a real figure needs an interval")
    return args, overrides


def main(argv=None) -> Path:
    args, overrides = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    study = Study(args, overrides)
    for trace in args.traces:
        study.trace(trace)
    study.write()
    print((args.out / "summary.md").read_text())
    return args.out


if __name__ == "__main__":
    main()
