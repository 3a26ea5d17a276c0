"""The fidelity study's code path at a small scale (tiny model, a few requests, two repeats): every table
it promises is written and consistent with its runs. Its figures are not checked here (they are the
study's output, measured on a quiet machine)."""

import json
import math

import pandas as pd
import pytest

from experiments.studies import fidelity, fidelity_reanalyze
from experiments.studies.fidelity_drift import (
    MATCHED,
    MATCHED_BEFORE,
    NO_KNEE,
    PAST_GRID,
    STEP_MATCHED,
    cost_scales,
    drift_matched,
    knee_matched,
    markdown,
    run_probe,
    step_scales,
)
from experiments.studies.fidelity_report import METRICS, knee, knees, residuals_by_repeat
from experiments.studies.probe_gauge import probe_gauge, probe_gauge_runs, probe_gauge_segments
from testbed.sim.cost_models.operators import fit_operators
from testbed.sim.cost_models.profile import FORMAT, fit
from testbed.sim.shape import StepShape

from .test_operator_cost import planted

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def profile(tmp_path):
    """A profile of the tiny model from planted timings (the study's code path needs one, not a real one)."""
    samples, shapes, seconds = planted(noise=0.01)
    path = tmp_path / "tiny.json"
    path.write_text(
        json.dumps(
            {
                "format": FORMAT,
                "model": "tiny",
                "kernel": "torch",
                "dtype": "float32",
                **fit(shapes, seconds),
                "self_check": {"probe_seconds": [0.05, 0.05, 0.05]},
                "operators": fit_operators(samples, shapes, seconds),
            }
        )
    )
    return path


def test_knee_interpolates_between_the_last_met_and_first_missed_load():
    assert knee([1, 2, 3, 4], [1.0, 0.95, 0.85, 0.2]) == (pytest.approx(2.5), False)
    assert knee([1, 2], [1.0, 0.95]) == (2, True)  # every load met: a lower bound
    assert math.isnan(knee([1, 2], [0.5, 0.1])[0])


def _open_sweep(real_attainments: list[float], sim_attainments: list[float]) -> pd.DataFrame:
    """One trace's open cells at 1, 2, 3 req/s: three real repeats and a raw and a matched simulation each."""
    rows = []
    for rate, real, sim in zip((1.0, 2.0, 3.0), real_attainments, sim_attainments):
        common = {"trace": "t", "mode": "open", "offered_rate": rate, "cost_model": "profile"}
        rows.append({**common, "side": "sim", "repeat": math.nan, "slo_attainment": sim})
        for repeat in range(3):
            rows.append({**common, "side": "real", "repeat": repeat, "slo_attainment": real})
            rows.append({**common, "side": MATCHED, "repeat": repeat, "slo_attainment": sim})
    return pd.DataFrame(rows)


def test_a_knee_below_the_load_grid_is_named_so_not_unexplained():
    """No real run met the attainment at any load: the knee lies below the grid, which is no model error."""
    below = knee_matched(_open_sweep([0.6, 0.5, 0.4], [0.6, 0.5, 0.4]))
    assert below["verdict"].tolist() == [NO_KNEE]
    found = knee_matched(_open_sweep([1.0, 0.95, 0.5], [1.0, 0.95, 0.5]))  # the same knee both sides
    assert found["verdict"].tolist() == ["met"]
    assert found["raw_error"].iloc[0] == pytest.approx(0.0)


def test_a_simulated_knee_past_the_load_grid_is_not_met():
    """The simulation meets the attainment at every load, so its knee is only >= 3 req/s: neither table may
    call that met, also where the bound lies within 5% of the real knee (2.91 req/s: +3.1%)."""
    runs = _open_sweep([1.0, 0.91, 0.5], [1.0, 0.95, 0.92])
    matched = knee_matched(runs)
    assert matched["verdict"].tolist() == [PAST_GRID] and bool(matched["knee_is_lower_bound"].iloc[0])
    table = knees(runs)
    assert bool(table["sim_knee_is_lower_bound"].iloc[0]) and not bool(table["meets_target"].iloc[0])
    near = _open_sweep([1.0, 0.95, 0.895], [1.0, 0.95, 0.91])  # real knee 2.91, simulated >= 3
    assert knee_matched(near)["verdict"].tolist() == [PAST_GRID]
    assert knees(near)["rel_error"].iloc[0] == pytest.approx(3 / (2 + 0.05 / 0.055) - 1)  # +3.1%: within 5%
    assert not bool(knees(near)["meets_target"].iloc[0])


def test_residuals_by_repeat_recover_a_planted_speed_change():
    """Repeat 0 runs at the priced speed, repeat 1 10% faster (every step 1/1.1 of the price), repeat 2 5%
    slower: the medians must say +10% and -4.8% for repeats 1 and 2, exactly 0 for repeat 0."""
    rows = []
    for repeat, speed in ((0, 1.0), (1, 1.1), (2, 1 / 1.05)):
        for i in range(9):
            predicted = 0.03 + 0.002 * i
            for cost_model in ("profile", "operators"):
                rows.append(
                    {
                        "cell": f"c{i % 3}",
                        "repeat": repeat,
                        "drift": 0.01 * repeat,
                        "cost_model": cost_model,
                        "kind": "decode",
                        "measured_s": predicted / speed,
                        "predicted_s": predicted,
                    }
                )
    table = residuals_by_repeat(pd.DataFrame(rows)).set_index(["cost_model", "repeat"])
    for cost_model in ("profile", "operators"):
        assert table.loc[(cost_model, 0), "median_rel_error"] == pytest.approx(0, abs=1e-12)
        assert table.loc[(cost_model, 1), "median_rel_error"] == pytest.approx(0.1)
        assert table.loc[(cost_model, 2), "median_rel_error"] == pytest.approx(1 / 1.05 - 1)
        assert table.loc[(cost_model, 2), "steps"] == 9
        assert table.loc[(cost_model, 2), "mean_probe_drift"] == pytest.approx(0.02)


def test_drift_matching_recovers_a_planted_machine_speed():
    """Each real run ran at a speed its probe measured exactly (probe = reference x slowdown, every time x
    slowdown): the matched simulations (scale = that slowdown) hit the real mean exactly, the raw one does not,
    and per run the probe predicts the step residual with r = -1 and slope -1, matched residual 0."""
    reference, slow = 1.0, {0: 1.3, 1: 1.2, 2: 1.1}
    base = {m: 100.0 for m in METRICS}
    ident = {"cell": "c", "trace": "synthetic", "mode": "closed", "level": 4.0, "offered_rate": None}
    rows = [
        {**ident, **{m: v * k for m, v in base.items()}, "side": "real", "repeat": r, "probe_s": reference * k}
        for r, k in slow.items()
    ]
    rows.append({**ident, **base, "side": "sim", "cost_model": "profile"})
    rows += [
        {**ident, **{m: v * k for m, v in base.items()}, "side": MATCHED, "cost_model": "profile", "repeat": r,
         "cost_scale": k}
        for r, k in slow.items()
    ]  # fmt: skip
    table = drift_matched(pd.DataFrame(rows)).set_index("metric")
    tpot = table.loc["median_tpot_ms"]
    assert tpot["real_mean"] == pytest.approx(120) and tpot["raw_error"] == pytest.approx(100 / 120 - 1)
    assert tpot["matched_error"] == pytest.approx(0, abs=1e-12) and tpot["matched_inside"]
    assert tpot["verdict"] == "drift" and tpot["spread_exceeds_target"]  # half-width 24.8 = 20.7% of the mean
    assert pd.isna(table.loc["request_throughput", "verdict"])  # no target
    steps = pd.DataFrame(
        [
            {"cell": "c", "repeat": r, "cost_model": "profile", "kind": "decode", "predicted_s": 0.01 * (1 + i),
             "measured_s": 0.01 * (1 + i) * k}
            for r, k in slow.items()
            for i in range(5)
        ]
    )  # fmt: skip
    per_run = probe_gauge_runs(steps, pd.DataFrame(rows), reference)
    assert per_run["matched_median_residual"].abs().max() < 1e-12
    gauge = probe_gauge(per_run).iloc[0]
    assert gauge["pearson_r"] == pytest.approx(-1) and gauge["slope"] == pytest.approx(-1) and gauge["runs"] == 3
    # a probe that saw nothing (every probe = the reference): matching changes nothing, the oracle at each
    # run's own step speed (1 / (1 + its median residual) = the planted slowdown) meets the target: `speed`
    assert step_scales(per_run)["cost_scale"].to_numpy() == pytest.approx(list(slow.values()))
    blind = [{**r, "probe_s": reference} if r["side"] == "real" else r for r in rows if r["side"] != MATCHED]
    blind += [{**ident, **base, "side": MATCHED, "cost_model": "profile", "repeat": r, "cost_scale": 1.0} for r in slow]
    blind += [
        {**ident, **{m: v * k for m, v in base.items()}, "side": STEP_MATCHED, "cost_model": "profile", "repeat": r}
        for r, k in zip(step_scales(per_run)["repeat"], step_scales(per_run)["cost_scale"])
    ]
    tpot = drift_matched(pd.DataFrame(blind)).set_index("metric").loc["median_tpot_ms"]
    assert tpot["matched_error"] == pytest.approx(100 / 120 - 1) and tpot["step_matched_error"] == pytest.approx(0)
    assert tpot["verdict"] == "speed"


def test_matching_on_the_probes_before_and_after_a_run_recovers_a_speed_that_moved_during_it():
    """Each run's steps ran at the mean of its two probes' speeds (the machine drifted steadily from one to the
    other): matching on that mean hits the real figures and gauges the runs with r = -1 and slope -1; matching
    on the probe before alone does neither. A study without probes after (before this existed) matches on
    the probe before, and gauges with it alone."""
    reference, probes = 1.0, {0: (1.3, 1.1), 1: (1.0, 1.2), 2: (1.15, 0.85)}  # runs at 1.2, 1.1, 1.0
    speed = {r: (b + a) / 2 for r, (b, a) in probes.items()}
    base = {m: 100.0 for m in METRICS}
    ident = {"cell": "c", "trace": "synthetic", "mode": "closed", "level": 4.0, "offered_rate": None}
    rows = [
        {**ident, **{m: v * speed[r] for m, v in base.items()}, "side": "real", "repeat": r, "probe_s": b,
         "probe_after_s": a}
        for r, (b, a) in probes.items()
    ]  # fmt: skip
    scales = cost_scales(pd.DataFrame(rows), reference).set_index("repeat")
    assert scales["cost_scale"].to_dict() == pytest.approx(speed)
    assert scales["cost_scale_before"].to_dict() == pytest.approx({r: b for r, (b, _) in probes.items()})
    assert scales["cost_scale_after"].to_dict() == pytest.approx({r: a for r, (_, a) in probes.items()})
    assert run_probe(1.3, 1.1) == pytest.approx(1.2) and run_probe(1.3, math.nan) == run_probe(1.3, None) == 1.3
    rows.append({**ident, **base, "side": "sim", "cost_model": "profile"})
    for side, scale in ((MATCHED, speed), (MATCHED_BEFORE, {r: b for r, (b, _) in probes.items()})):
        rows += [
            {**ident, **{m: v * scale[r] for m, v in base.items()}, "side": side, "cost_model": "profile",
             "repeat": r, "cost_scale": scale[r]}
            for r in probes
        ]  # fmt: skip
    table = drift_matched(pd.DataFrame(rows))
    tpot = table.set_index("metric").loc["median_tpot_ms"]
    assert tpot["matched_error"] == pytest.approx(0, abs=1e-12) and tpot["verdict"] == "drift"
    assert tpot["matched_before_error"] == pytest.approx((1.3 + 1.0 + 1.15) / 3 / 1.1 - 1)
    assert tpot["cost_scale_before_mean"] == pytest.approx(1.15) and tpot["cost_scale_mean"] == pytest.approx(1.1)
    steps = pd.DataFrame(
        [
            {"cell": "c", "repeat": r, "cost_model": "profile", "kind": "decode", "predicted_s": 0.01 * (1 + i),
             "measured_s": 0.01 * (1 + i) * speed[r]}
            for r in probes
            for i in range(5)
        ]
    )  # fmt: skip
    per_run = probe_gauge_runs(steps, pd.DataFrame(rows), reference)
    assert per_run["matched_median_residual"].abs().max() < 1e-12
    gauge = probe_gauge(per_run).set_index("probe")
    assert list(gauge.index) == ["before", "after", "mean"]
    assert gauge.loc["mean", "pearson_r"] == pytest.approx(-1) and gauge.loc["mean", "slope"] == pytest.approx(-1)
    assert gauge.loc["before", "pearson_r"] > -0.9 and gauge.loc["after", "pearson_r"] > -0.9
    assert gauge.loc["before", "median_abs_residual_matched"] > 0.05
    assert "{b +4.5%}" in markdown(table, pd.DataFrame(), probe_gauge(per_run), "header")
    # the speed moved during each run: its first half at the probe before's speed, its second at the probe
    # after's: the probe before gauges the first fifth exactly, the probe after the last fifth
    moving = pd.DataFrame(
        [
            {"cell": "c", "repeat": r, "cost_model": "profile", "predicted_s": 0.01,
             "measured_s": 0.01 * (b if i < 5 else a)}
            for r, (b, a) in probes.items()
            for i in range(10)
        ]
    )  # fmt: skip
    parts = probe_gauge_segments(moving, pd.DataFrame(rows), reference).set_index(["part", "probe"])
    for part, probe in (("first fifth", "before"), ("last fifth", "after")):
        assert parts.loc[(part, probe), "slope"] == pytest.approx(-1) and parts.loc[
            (part, probe), "pearson_r"
        ] == pytest.approx(-1)
    assert parts.loc[("last fifth", "before"), "pearson_r"] > -0.9 and len(parts) == 9
    assert "The gauge by part of the run" in markdown(table, pd.DataFrame(), pd.DataFrame(), "h", parts.reset_index())
    # a study without probes after: matched on the probe before, one gauge row, no `{b ...}` in the markdown
    old = pd.DataFrame(rows).drop(columns="probe_after_s")
    assert cost_scales(old, reference)["cost_scale"].tolist() == [1.3, 1.0, 1.15]
    assert probe_gauge(probe_gauge_runs(steps, old, reference))["probe"].tolist() == ["before"]
    same = [{**r, "cost_scale": 1.0} if r["side"] in (MATCHED, MATCHED_BEFORE) else r for r in rows]
    assert "{b +" not in markdown(drift_matched(pd.DataFrame(same)), pd.DataFrame(), pd.DataFrame(), "header")


def test_a_profile_without_operators_is_refused_before_any_run(tmp_path, profile):
    meta = json.loads(profile.read_text())
    del meta["operators"]
    profile.write_text(json.dumps(meta))
    with pytest.raises(SystemExit, match="no operator microbenchmarks"):
        fidelity.main(["--profile", str(profile), "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x" / "runs").exists()


def test_study_small_scale(tmp_path, profile, monkeypatch):
    monkeypatch.setenv("TESTBED_KERNEL", "torch")
    out = tmp_path / "study"
    overrides = ["slo.ttft_ms=50", "slo.tpot_ms=20", "cache.num_blocks=128"]
    short = ["replay.max_prompt_tokens=40", "replay.max_output_tokens=5"]
    flags = "--scale 0.07 --repeats 2 --probe-repeats 1 --traces synthetic azure --concurrency 4 --loads 0.5 1.2"
    fidelity.main([*overrides, *short, "--profile", str(profile), "--out", str(out), *flags.split(), "--drift-matched"])
    every = pd.read_csv(out / "runs.csv")
    runs = every[~every["side"].isin([MATCHED, MATCHED_BEFORE])]
    cells = [f"{t}_{c}" for t in ("synthetic", "azure") for c in ("closed_c4", "open_50pct", "open_120pct")]
    assert list(dict.fromkeys(runs["cell"])) == cells
    for cell, g in runs.groupby("cell"):
        assert sorted(g["side"]) == ["real", "real", "sim", "sim"], cell
        assert g["completed"].min() >= 4
    real = runs[runs["side"] == "real"]
    assert real["probe_s"].gt(0).all() and real["probe_after_s"].gt(0).all()  # a probe before and after each run
    assert real["drift"].notna().all() and real["drift_after"].notna().all()
    assert (real["drift_mean"] + 1).to_numpy() == pytest.approx(
        ((1 + real["drift"]) + (1 + real["drift_after"])).to_numpy() / 2
    )  # the run probe (the mean of the two) against the same reference
    capacity = real[real["cell"] == "synthetic_closed_c4"]["request_throughput"].mean()
    opened = runs[runs["cell"] == "synthetic_open_120pct"]["offered_rate"]
    assert opened.iloc[0] == pytest.approx(1.2 * capacity)  # open loads are fractions of the measured capacity
    figs = pd.read_csv(out / "figures.csv")
    assert len(figs) == len(cells) * 2 * len(fidelity.report.METRICS)
    row = figs[(figs["cell"] == "azure_closed_c4") & (figs["metric"] == "median_e2el_ms")].iloc[0]
    values = real[real["cell"] == "azure_closed_c4"]["median_e2el_ms"]
    assert row["real_n"] == 2 and row["real_mean"] == pytest.approx(values.mean())
    assert row["real_ci_low"] <= row["real_mean"] <= row["real_ci_high"]
    assert row["inside_real_ci"] == (row["real_ci_low"] <= row["sim"] <= row["real_ci_high"])
    assert row["rel_error"] == pytest.approx((row["sim"] - row["real_mean"]) / row["real_mean"])
    assert row["target"] == 0.05
    cell_real = real[real["cell"] == "azure_closed_c4"]
    for column, drift in (("before", "drift"), ("after", "drift_after"), ("mean", "drift_mean")):
        assert row[f"probe_drift_{column}"] == pytest.approx(cell_real[drift].mean())
    summary_text = (out / "summary.md").read_text()
    assert "probe drift before / after / mean" in summary_text and "per real repeat" in summary_text
    assert sorted(real["repeat"]) == [0] * len(cells) + [1] * len(cells)
    knees = pd.read_csv(out / "knee.csv")
    assert sorted(zip(knees["trace"], knees["cost_model"])) == [
        ("azure", "operators"),
        ("azure", "profile"),
        ("synthetic", "operators"),
        ("synthetic", "profile"),
    ]
    assert all(k.count(",") == 1 for k in knees["real_knees"])  # one knee per real repeat
    by_kind = pd.read_csv(out / "residuals_by_kind.csv")
    assert {"decode", "mixed"} <= set(by_kind["kind"]) and set(by_kind["cost_model"]) == {"profile", "operators"}
    steps = pd.read_csv(out / "step_residuals.csv")
    assert len(steps) == 2 * by_kind[by_kind["cost_model"] == "profile"]["steps"].sum()
    # each step's whole shape is kept: the profile prices it again from these columns alone
    engine = type("Engine", (), {"model_name": "tiny", "kernel": "torch", "dtype": "float32"})
    model = fidelity.cost_model("profile", profile, engine)
    one = steps[steps["cost_model"] == "profile"].iloc[-1]
    shape = StepShape(**{f: one[f].item() for f in StepShape.__dataclass_fields__})
    assert model.step_time(shape) == pytest.approx(one["predicted_s"])
    assert steps["drift"].notna().all()
    by_repeat = pd.read_csv(out / "residuals_by_repeat.csv")
    assert set(by_repeat["repeat"]) == {0, 1}
    assert by_repeat.groupby("repeat")["steps"].sum().sum() == by_kind["steps"].sum()
    summary = (out / "summary.md").read_text()
    assert "executor.cost_model=operators (SIMULATED)" in summary and "Capacity knee" in summary
    assert "per real repeat" in summary and "Calibration: profile dated" in summary
    assert (out / "runs" / "azure_open_50pct" / "real1" / "requests.parquet").exists()
    assert (out / "runs" / "azure_open_50pct" / "sim-operators" / "summary.json").exists()
    # --drift-matched: each real run simulated again at its run probe (the mean of its probes before and
    # after) / the calibration's mean probe (0.05 s), and at its probe before alone
    matched = every[every["side"] == MATCHED].merge(
        real[["cell", "repeat", "probe_s", "probe_after_s"]], on=["cell", "repeat"], suffixes=("", "_real")
    )
    assert len(matched) == 2 * len(real)
    pair = (matched["probe_s_real"] + matched["probe_after_s_real"]).to_numpy() / 2
    assert matched["cost_scale"].to_numpy() == pytest.approx(pair / 0.05)
    before = every[every["side"] == MATCHED_BEFORE].merge(
        real[["cell", "repeat", "probe_s"]], on=["cell", "repeat"], suffixes=("", "_real")
    )
    assert len(before) == 2 * len(real)
    assert before["cost_scale"].to_numpy() == pytest.approx(before["probe_s_real"].to_numpy() / 0.05)
    scaled = json.loads((out / "runs" / "azure_closed_c4" / "sim-profile-matched1" / "summary.json").read_text())
    assert scaled["sim_cost_scale"] == pytest.approx(matched.set_index(["cell", "cost_model", "repeat"]).loc[
        ("azure_closed_c4", "profile", 1), "cost_scale"])  # fmt: skip
    table = pd.read_csv(out / "drift_matched.csv")
    assert len(table) == len(cells) * 2 * len(METRICS) and table["verdict"].notna().sum() == len(cells) * 2 * 6
    assert len(pd.read_csv(out / "probe_gauge_runs.csv")) == 2 * len(real)
    assert table["matched_before_error"].notna().all()
    assert len(pd.read_csv(out / "probe_gauge_segments.csv")) == 2 * 3 * 3  # cost models x parts x probes
    gauge = pd.read_csv(out / "probe_gauge.csv")
    assert sorted(zip(gauge["cost_model"], gauge["probe"])) == sorted(
        (m, p) for m in ("profile", "operators") for p in ("before", "after", "mean")
    )
    assert "Is the probe a faithful gauge?" in (out / "drift_matched.md").read_text()
    # the re-analysis of the finished folder simulates the same runs again: the same tables (plus the oracle
    # at each run's own step speed, which only the re-analysis runs, so verdicts may move to `speed`); one
    # cost model, to keep the test short (the code path is the same for both)
    compared = ("drift_matched", "knee_matched", "probe_gauge", "probe_gauge_segments")
    for name in compared:
        (out / f"{name}.csv").rename(out / f"{name}.study.csv")
    fidelity_reanalyze.main([str(out), "--profile", str(profile), *overrides, *short, "--cost-models", "profile"])
    for name in compared:
        study = pd.read_csv(out / f"{name}.study.csv").query("cost_model == 'profile'").reset_index(drop=True)
        study = study.drop(columns=[c for c in study if c == "verdict" or "step_matched" in c])
        again = pd.read_csv(out / f"{name}.csv").query("cost_model == 'profile'").reset_index(drop=True)
        pd.testing.assert_frame_equal(again[study.columns], study)
    again = pd.read_csv(out / "drift_runs.csv")
    assert (again["side"] == STEP_MATCHED).sum() == len(real) and set(again["cost_model"].dropna()) == {"profile"}
    assert pd.read_csv(out / "drift_matched.csv")["step_matched_error"].notna().all()
    assert all(max(abs(v) for v in json.loads(d).values()) < 1e-9 for d in again["resim_vs_recorded"].dropna())
    # --reprice: another profile (here every coefficient doubled) prices the study's real steps again, and
    # the tables go to another folder; the study's own step residuals stay as measured
    doubled = json.loads(profile.read_text())
    doubled["coefficients"] = {k: 2 * v for k, v in doubled["coefficients"].items()}
    other, elsewhere = tmp_path / "doubled.json", tmp_path / "repriced"
    other.write_text(json.dumps(doubled))
    measured = pd.read_csv(out / "step_residuals.csv")
    with pytest.raises(SystemExit):
        fidelity_reanalyze.main([str(out), "--profile", str(other), "--reprice", *overrides, *short])
    fidelity_reanalyze.main(
        [str(out), "--profile", str(other), "--reprice", "--out", str(elsewhere), *overrides, *short,
         "--cost-models", "profile"]
    )  # fmt: skip
    pd.testing.assert_frame_equal(pd.read_csv(out / "step_residuals.csv"), measured)
    repriced = pd.read_csv(elsewhere / "step_residuals.csv")
    mine = measured["cost_model"] == "profile"
    assert repriced.loc[mine, "predicted_s"].to_numpy() == pytest.approx(2 * measured.loc[mine, "predicted_s"])
    assert repriced.loc[~mine, "predicted_s"].to_numpy() == pytest.approx(measured.loc[~mine, "predicted_s"])
    assert (elsewhere / "residuals_by_kind.csv").exists() and (elsewhere / "drift_matched.csv").exists()
    assert "--reprice" in (elsewhere / "drift_matched.md").read_text()


@pytest.mark.parametrize("sims_last", [False, True])
def test_order_of_real_runs_and_simulations(tmp_path, profile, monkeypatch, sims_last):
    """Default: each cell's simulations right after its real runs (repeat 0 of the next cell follows them).
    --sims-last: a trace's simulations after all its real runs, with the same rows recorded per cell."""
    order = []

    def run(side):
        def record(self, cell, overrides, arg):
            order.append((side, cell.name))
            row = {m: 1.0 for m in fidelity.report.METRICS}
            return {**row, "side": side, "repeat": arg if side == "real" else None, "cost_model": arg, "drift": 0.0}

        return record

    monkeypatch.setattr(fidelity.Study, "real", run("real"))
    monkeypatch.setattr(fidelity.Study, "sim", run("sim"))
    flags = f"--profile {profile} --out {tmp_path} --repeats 2 --concurrency 4 16 --loads 0.5"
    args, overrides = fidelity.parse([*flags.split(), *(["--sims-last"] if sims_last else [])])
    fidelity.Study(args, overrides).trace("synthetic")
    cells = ["synthetic_closed_c4", "synthetic_closed_c16", "synthetic_open_50pct"]
    real = [("real", c) for c in cells for _ in range(2)]
    sims = [("sim", c) for c in cells for _ in range(2)]
    if sims_last:
        assert order == real + sims
    else:
        assert order == [x for c in cells for x in [("real", c)] * 2 + [("sim", c)] * 2]
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert sorted(zip(runs["cell"], runs["side"])) == sorted((c, s) for s, c in real + sims)
    assert runs[runs["cell"] == "synthetic_open_50pct"]["offered_rate"].eq(0.5).all()  # capacity 1.0 req/s
    summary = (tmp_path / "summary.md").read_text()
    assert "executor.cost_model=operators (SIMULATED)" in summary and "Real figures" in summary
    assert len(pd.read_csv(tmp_path / "figures.csv")) == len(cells) * 2 * len(fidelity.report.METRICS)
