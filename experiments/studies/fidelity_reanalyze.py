"""Drift-matched re-analysis of a finished fidelity study folder (experiments/studies/fidelity_drift.py).

    python -m experiments.studies.fidelity_reanalyze results/fidelity/v3_2026-12-03 [--profile P]

Reads the folder's runs.csv (each real run's probe time) and step_residuals.csv, and each cell's recorded
simulation config (runs/<cell>/sim-<model>/config.yaml: its request count and arrival rate), then simulates
every cell again with the code as it is now: once at cost_scale 1 (the raw figure, so raw and matched differ
by the scale alone; `resim_vs_recorded` in drift_runs.csv says how far it is from the study's own
simulation) and once per real run at cost_scale = that run's probe / the mean of the calibration's three
probes (the run probe: the mean of its probes before and after, fidelity_drift.run_probe; beside it the probe
before alone, the same simulation where no probe after was timed), and once at the run's own median step
speed (the oracle, fidelity_drift.STEP_MATCHED: cost_scale = 1 / (1 + that run's median step residual in
step_residuals.csv)). Simulations are deterministic and run on a virtual clock: the machine's load does not
enter.
Writes drift_runs.csv, drift_matched.csv, knee_matched.csv, probe_gauge.csv, probe_gauge_runs.csv,
probe_gauge_segments.csv and
drift_matched.md into the folder (their runs in a temporary folder unless --keep-runs).

With --reprice --profile P --out OUT, P being another profile than the study ran on (e.g. one refitted by
experiments.calibration.refit), the study's real steps are priced again by P first (step_residuals.csv's
predicted_s: the oracle and the step residuals then describe P), and every table, with the repriced
step_residuals.csv and residuals_by_kind.csv, goes to OUT, another folder: the study's own files stay as measured.
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from experiments.results.atomic import atomic_open
from experiments.studies import fidelity_drift as drift
from experiments.studies import probe_gauge as gauge
from experiments.studies.fidelity import cost_model_for, drift_tables_of, simulate, write_drift_markdown
from experiments.studies.fidelity_plan import Cell
from experiments.studies.fidelity_report import METRICS, calibration_line, residuals_by_kind
from testbed.sim.shape import StepShape


def find_profile(folder: Path, given: Path | None) -> Path:
    if given is not None:
        return given
    found = sorted((folder / "profile").glob("*.json"))
    if len(found) != 1:
        raise SystemExit(f"{folder}: no single profile in {folder / 'profile'}; pass --profile PATH")
    return found[0]


def reprice(steps: pd.DataFrame, profile: Path) -> pd.DataFrame:
    """step_residuals with predicted_s priced by `profile`'s cost models (the study priced them with its own)."""
    meta = json.loads(profile.read_text())
    fields = list(StepShape.__dataclass_fields__)
    out = steps.copy()
    for name in out["cost_model"].unique():
        model = cost_model_for(name, profile, meta["model"], meta["kernel"], meta["dtype"])
        rows = out["cost_model"] == name
        shapes = out.loc[rows, fields].itertuples(index=False, name=None)
        out.loc[rows, "predicted_s"] = [model.step_time(StepShape(*shape)) for shape in shapes]
    return out


def cell_overrides(folder: Path, row, cost_model: str) -> list[str]:
    """The cell's overrides as the study composed them (experiments.studies.fidelity_plan.Cell), its request
    count and open-loop rate read back from the study's own simulation of it."""
    recorded = OmegaConf.load(folder / "runs" / row["cell"] / f"sim-{cost_model}" / "config.yaml")
    trace = recorded.trace
    n = int(trace.get("num_requests") or trace.get("max_requests"))
    cell = Cell(row["trace"], row["mode"], float(row["level"]), n)
    if cell.mode == "closed":
        return cell.overrides()
    rate = float(row["offered_rate"])
    native = rate / float(trace.time_scale) if cell.trace != "synthetic" else None
    return cell.overrides(rate / cell.level, native)


def reanalyze(
    folder: Path,
    profile: Path,
    runs_dir: Path,
    user: list[str],
    cost_models: list[str] | None,
    steps: pd.DataFrame,
) -> pd.DataFrame:
    """runs.csv's real rows plus, per cell and cost model, the re-simulation at scale 1 (side sim), one
    matched simulation per real run (side sim_matched) and one at its own step speed (sim_step_matched)."""
    runs = pd.read_csv(folder / "runs.csv")
    meta = json.loads(profile.read_text())
    reference = drift.reference_probe(meta)
    if reference is None:
        raise SystemExit(f"{profile} records no calibration probe (self_check.probe_seconds): nothing to match")
    setup = [f"model={meta['model']}", f"kernel={meta['kernel']}"]
    real = drift.cost_scales(runs, reference)
    per_run = gauge.probe_gauge_runs(steps, runs, reference)
    oracle = drift.step_scales(per_run).set_index(["cost_model", "cell", "repeat"])["cost_scale"]
    recorded = runs[runs["side"] == "sim"]
    models = cost_models or list(dict.fromkeys(recorded["cost_model"]))
    rows = [real]
    for cell, group in real.groupby("cell", sort=False):
        first = group.iloc[0]
        for name in models:
            overrides = [*setup, *cell_overrides(folder, first, name), *user]
            base = simulate(overrides, profile, name, runs_dir / cell / f"sim-{name}")
            study = recorded[(recorded["cell"] == cell) & (recorded["cost_model"] == name)]
            same = {m: base[m] / float(study[m].iloc[0]) - 1 if len(study) else None for m in METRICS}
            out = [{**base, "side": "sim", "cost_model": name, "resim_vs_recorded": json.dumps(same)}]
            for r in group.itertuples():
                done: dict[float, dict] = {}  # no probe after the run: both matchings are the same simulation
                for side, scale in ((drift.MATCHED, r.cost_scale), (drift.MATCHED_BEFORE, r.cost_scale_before)):
                    if scale not in done:
                        suffix = "matched" if side == drift.MATCHED else "matched-before"
                        run_dir = runs_dir / cell / f"sim-{name}-{suffix}{r.repeat}"
                        done[scale] = simulate(overrides, profile, name, run_dir, scale)
                    out.append(
                        {**done[scale], "side": side, "cost_model": name, "repeat": r.repeat, "probe_s": r.probe_s,
                         "probe_after_s": r.probe_after_s, "drift": r.drift, "cost_scale": scale}
                    )  # fmt: skip
                if (name, cell, r.repeat) in oracle.index:
                    scale = float(oracle.loc[(name, cell, r.repeat)])
                    summary = simulate(overrides, profile, name, runs_dir / cell / f"sim-{name}-steps{r.repeat}", scale)
                    out.append(
                        {**summary, "side": drift.STEP_MATCHED, "cost_model": name, "repeat": r.repeat,
                         "probe_s": r.probe_s, "probe_after_s": r.probe_after_s, "drift": r.drift, "cost_scale": scale}
                    )  # fmt: skip
            keep = ["side", "cost_model", "repeat", "probe_s", "probe_after_s", "drift", "cost_scale", *METRICS,
                    "completed", "duration"]  # fmt: skip
            ident = {k: first[k] for k in ("cell", "trace", "mode", "level", "offered_rate")}
            rows.append(pd.DataFrame([{**ident, **{k: o.get(k) for k in [*keep, "resim_vs_recorded"]}} for o in out]))
            print(f"{cell} {name}: raw + {len(out) - 1} matched simulation rows", file=sys.stderr)
    return pd.concat(rows, ignore_index=True)


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="a fidelity study's --out folder (runs.csv, step_residuals.csv, runs/)")
    p.add_argument("--profile", type=Path, help="the profile the study ran on (default: FOLDER/profile/*.json)")
    p.add_argument("--cost-models", nargs="+", help="default: those the study simulated")
    p.add_argument("--attainment", type=float, default=0.9, help="SLO attainment that defines the knee")
    p.add_argument("--keep-runs", action="store_true", help="keep the simulations' run folders in FOLDER/drift_runs/")
    p.add_argument("--out", type=Path, help="the tables' folder (default: FOLDER)")
    p.add_argument("--reprice", action="store_true", help="price the real steps again by --profile (needs --out)")
    args, user = p.parse_known_args(argv)
    folder, profile = args.folder, find_profile(args.folder, args.profile)
    out, repriced = args.out or folder, args.reprice
    if repriced and (args.profile is None or out.resolve() == folder.resolve()):
        p.error("--reprice needs --profile and an --out other than the study's folder (its files stay as measured)")
    out.mkdir(parents=True, exist_ok=True)
    steps = pd.read_csv(folder / "step_residuals.csv")
    if repriced:
        steps = reprice(steps, profile)
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = out / "drift_runs" if args.keep_runs else Path(tmp)
        runs = reanalyze(folder, profile, runs_dir, user, args.cost_models, steps)
    meta = json.loads(profile.read_text())
    reference = drift.reference_probe(meta) or math.nan  # reanalyze() refused a profile without one
    tables = {"drift_runs": runs, **drift_tables_of(runs, steps, reference, args.attainment)}
    if repriced:
        tables |= {"step_residuals": steps, "residuals_by_kind": residuals_by_kind(steps)}
    for name, table in tables.items():
        with atomic_open(out / f"{name}.csv") as f:
            table.to_csv(f, index=False)
    flags = f"{f' --profile {profile}' if args.profile else ''}{' --reprice' if repriced else ''}"
    flags += f" --out {out}" if args.out else ""
    header = (
        f"Drift-matched re-analysis of `{folder.name}` (`python -m experiments.studies.fidelity_reanalyze "
        f"{folder}{flags}`): profile "
        f"`{profile}`{' (the real steps priced again by it)' if repriced else ''}, {calibration_line(meta)}. "
        f"Reference probe (mean of the calibration's three) {1e3 * reference:.0f} ms; each real "
        "run simulated again at cost_scale = its run probe (the mean of its probes before and after; before alone "
        "where none was timed after) / that reference, and (the oracle, `[s ...]`) at its own "
        "median step speed. Raw figures are re-simulated with "
        "today's code at cost_scale 1 (drift_runs.csv `resim_vs_recorded`: against the study's own simulation)."
    )
    write_drift_markdown(out, tables, header)
    print((out / "drift_matched.md").read_text())
    return out


if __name__ == "__main__":
    main()
