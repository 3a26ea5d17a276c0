"""Why the profile model's verdicts fell from v7 to v8: measured on the committed tables of v7 and v8 (and the
calibration samples stored in each profile), no simulation.

    python results/fidelity/v8_2026-12-03/why_v8.py > results/fidelity/v8_2026-12-03/why_v8.txt
    python results/fidelity/v8_2026-12-03/why_v8.py v8_2026-12-03 v9_2026-12-03     # any two studies of v7's cells

A step residual is predicted / measured - 1 (negative: the step ran slower than priced). v7 and v8 ran the same
cells with the same traces and seeds, and their calibrations the same workloads (v8 added "lone prefills"), so a
closed-loop cell's real runs schedule the same step shapes in the same order in both studies, and 709 of v8's
741 calibration steps have the shape of v7's step at the same place: those pairs compare the machine's speed
in the two studies without any cost model.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.sim.cost_models.profile import FEATURES, _nnls_relative, feature_rows, fit
from testbed.sim.shape import StepShape

HERE = Path(__file__).resolve().parent
A, B = (HERE.parent / name for name in (sys.argv[1:3] if len(sys.argv) > 2 else ("v7_2026-12-03", "v8_2026-12-03")))
LA, LB = A.name[:2], B.name[:2]
SHAPE = list(StepShape.__dataclass_fields__)
TARGETED = ["median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms"]
MARK = {"met": "M", "drift": "D", "speed": "V", "spread": "S", "unexplained": "U"}
pd.set_option("display.width", 220)


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def group(cell: str) -> str:
    trace, mode, level = cell.split("_")
    return f"{trace} {'c=1' if level == 'c1' else mode}"


def calibration(folder: Path) -> tuple[dict, pd.DataFrame]:
    profile = json.loads(next((folder / "profile").glob("*.json")).read_text())
    s = profile["samples"]
    cal = pd.DataFrame(s["shapes"], columns=SHAPE).assign(t=s["seconds"], workload=s["workload"])
    cal["kind"] = np.where(cal.prefill_seqs == 0, "decode", np.where(cal.decode_seqs == 0, "prefill", "mixed"))
    return profile, cal


def shapes(df: pd.DataFrame) -> list[StepShape]:
    return [StepShape(*row) for row in df[SHAPE].astype(object).itertuples(index=False)]


def price(fitted: dict, df: pd.DataFrame) -> np.ndarray:
    coef = np.array([fitted["coefficients"][f] for f in FEATURES])
    return feature_rows(shapes(df), fitted["knee_tokens"]) @ coef


def study_steps(folder: Path) -> pd.DataFrame:
    st = pd.read_csv(folder / "step_residuals.csv")
    st = st[st.cost_model == "profile"].copy()
    st["group"] = st.cell.map(group)
    st["trace"] = st.cell.str.split("_").str[0]
    st["i"] = st.groupby(["cell", "repeat"]).cumcount()
    return st


p_a, cal_a = calibration(A)
p_b, cal_b = calibration(B)
st_a, st_b = study_steps(A), study_steps(B)

print(
    f"1. Verdicts of the targeted figures by group of cells, {LA} -> {LB} (drift_matched.csv; M D V S U, median raw error)"
)
for model in ("profile", "operators"):
    for folder in (A, B):
        d = pd.read_csv(folder / "drift_matched.csv")
        d = d[(d.cost_model == model) & d.metric.isin(TARGETED)].assign(group=lambda x: x.cell.map(group))
        parts = []
        for g, x in d.groupby("group", sort=False):
            vc = x.verdict.map(MARK).value_counts()
            parts.append(f"{g} " + "/".join(str(vc.get(k, 0)) for k in "MDVSU") + f" ({pct(x.raw_error.median())})")
        print(f"   {folder.name[:2]} {model:9s} " + "; ".join(parts))
print()

print("2. How fast each real run's steps ran against the profile's price (profile model): per group, the median over")
print("   runs of the run's median step residual, of its busy-time residual (sum predicted / sum measured - 1), and of")
print("   its probe ratio (mean of the probes before and after / the calibration's reference probe; above 1 = slower)")
rows = []
for folder, st in ((A, st_a), (B, st_b)):
    runs = pd.read_csv(folder / "probe_gauge_runs.csv")
    runs = runs[runs.cost_model == "profile"].set_index(["cell", "repeat"])
    busy = st.groupby(["cell", "repeat"]).apply(lambda g: g.predicted_s.sum() / g.measured_s.sum() - 1)
    runs["busy_residual"] = busy
    runs["group"] = runs.index.get_level_values(0).map(group)
    for g, x in runs.groupby("group", sort=False):
        rows.append({"study": folder.name[:2], "group": g, "runs": len(x), "median step residual": pct(x.median_residual.median()),
                     "busy-time residual": pct(x.busy_residual.median()), "probe ratio": f"{x.probe_ratio.median():.3f}"})  # fmt: skip
print(pd.DataFrame(rows).pivot(index="group", columns="study").to_string(), "\n")

print("3. The machine's speed, same step shapes, no cost model")
a = cal_a.assign(i=cal_a.groupby("workload").cumcount()).set_index(["workload", "i"])
b = cal_b.assign(i=cal_b.groupby("workload").cumcount()).set_index(["workload", "i"])
j = a.merge(b, left_index=True, right_index=True, suffixes=("", "_b"))
same = (j[SHAPE].to_numpy() == j[[f + "_b" for f in SHAPE]].to_numpy()).all(axis=1)
j = j[same]
print(
    f"   3a. Calibrations, {LB} / {LA} step time on the {len(j)} steps of identical shape at the same place (of {LB}'s "
    f"{len(cal_b)}):"
)
for k, g in [("all", j), *j.groupby("kind")]:
    print(
        f"       {k:8s} {len(g):4d} steps: median ratio {(g.t_b / g.t).median():.3f}, busy time {g.t_b.sum() / g.t.sum():.3f}"
    )
k_a = st_a.set_index(["cell", "repeat", "i"])
k_b = st_b.set_index(["cell", "repeat", "i"])
j = k_a.merge(k_b, left_index=True, right_index=True, suffixes=("", "_b"))
j = j[(j[SHAPE].to_numpy() == j[[f + "_b" for f in SHAPE]].to_numpy()).all(axis=1)]
closed = j[j.index.get_level_values(0).str.contains("closed")]
print(f"   3b. Studies, {LB} / {LA} step time on closed-loop cells' steps of identical shape and place:")
for cell, g in closed.groupby(level=0, sort=False):
    n7 = (k_a.loc[cell].shape[0], g.shape[0])
    print(
        f"       {cell:22s} {n7[1]:5d} of {n7[0]:5d} steps: median ratio {(g.measured_s_b / g.measured_s).median():.3f},"
        f" busy time {g.measured_s_b.sum() / g.measured_s.sum():.3f}"
    )
print(
    f"       all closed: median {(closed.measured_s_b / closed.measured_s).median():.3f}, busy time "
    f"{closed.measured_s_b.sum() / closed.measured_s.sum():.3f}; by trace: "
    + ", ".join(f"{t} {g.measured_s_b.sum() / g.measured_s.sum():.3f}" for t, g in closed.groupby("trace"))
)
print("   3c. Each study against its own calibration, same shape: single-sequence prefills (no cached prefix) of the")
print("       calibration's prompt lengths (study steps within 5% or 4 tokens of it), ms per prompt token:")
for folder, cal, st in ((A, cal_a, st_a), (B, cal_b, st_b)):
    lone = cal[(cal.num_seqs == 1) & (cal.decode_seqs == 0) & (cal.prefill_context == cal.prefill_tokens)]
    s = st[(st.num_seqs == 1) & (st.kind == "prefill") & (st.prefill_context == st.prefill_tokens)]
    out = []
    for length, g in lone.groupby("prefill_tokens"):
        m = s[(s.prefill_tokens - length).abs() <= max(4, 0.05 * length)]
        if len(m):
            c_ms, s_ms = 1e3 * (g.t / g.prefill_tokens).median(), 1e3 * (m.measured_s / m.prefill_tokens).median()
            out.append((length, len(g), c_ms, len(m), s_ms, ", ".join(sorted(m.trace.unique()))))
    print(
        f"       {folder.name[:2]}: "
        + "; ".join(f"{L}: {c:.2f} ({n}) -> {s_:.2f} ({m}, {tr}) = {s_ / c:.3f}" for L, n, c, m, s_, tr in out)
    )
print("       small-batch pure decode, 1-16 sequences at 40-100 tokens of context each, median ms (steps):")
for folder, cal, st in ((A, cal_a, st_a), (B, cal_b, st_b)):
    out = []
    for name, df in (("cal", cal), ("study", st)):
        d = df[(df.prefill_seqs == 0) & (df.num_seqs <= 16)]
        d = d[(d.decode_context / d.num_seqs).between(40, 100)]
        out.append(
            d.assign(t=d["t"] if name == "cal" else d["measured_s"]).groupby("num_seqs").t.agg(["median", "size"])
        )
    m = out[0].merge(out[1], left_index=True, right_index=True, suffixes=("_cal", "_study"))
    m = m[(m.size_cal >= 5) & (m.size_study >= 5)]
    print(
        f"       {folder.name[:2]}: "
        + "; ".join(
            f"{n} seqs {1e3 * r.median_cal:.1f} ({r.size_cal}) -> {1e3 * r.median_study:.1f} ({r.size_study}) = "
            f"{r.median_study / r.median_cal:.3f}"
            for n, r in m.iterrows()
        )
    )
print(
    "   3d. Probes (ms): the calibration's start / middle / end and reference (their mean); the study's probes, median"
)
for folder, p in ((A, p_a), (B, p_b)):
    runs = pd.read_csv(folder / "runs.csv")
    real = runs[runs.side == "real"].assign(trace=lambda x: x.cell.str.split("_").str[0])
    probe = (real.probe_s + real.probe_after_s) / 2
    ps = p["self_check"]["probe_seconds"]
    print(
        f"       {folder.name[:2]}: calibration {' / '.join(f'{1e3 * x:.1f}' for x in ps)}, reference "
        f"{1e3 * np.mean(ps):.1f}; study {1e3 * probe.median():.1f} ("
        + ", ".join(f"{t} {1e3 * g.median():.1f}" for t, g in probe.groupby(real.trace))
        + ")"
    )
print("   3e. Real capacity (closed c=64 request throughput, req/s, per repeat):")
for folder in (A, B):
    runs = pd.read_csv(folder / "runs.csv")
    c = runs[(runs.side == "real") & (runs["mode"] == "closed") & (runs.level == 64)]
    print(
        f"       {folder.name[:2]}: "
        + "; ".join(
            f"{t} {' / '.join(f'{x:.3f}' for x in g.request_throughput)} (mean {g.request_throughput.mean():.3f})"
            for t, g in c.groupby("trace", sort=False)
        )
    )
print()

print(
    f"4. The lone-prefill rows in {LB}'s fit: refit of {LB}'s calibration without them (testbed/sim/cost_models/profile.py"
)
print(
    f"   fit), coefficients in ms per unit, in-sample median residual by workload kind, and {LB}'s real busy steps priced"
)
print("   by each fit (median residual by trace and kind; steps)")
nolone = cal_b[cal_b.workload != "lone prefills"]
fits = {
    f"{LA} profile": {"knee_tokens": p_a["knee_tokens"], "coefficients": p_a["coefficients"], "fit": p_a["fit"]},
    f"{LB} profile": {"knee_tokens": p_b["knee_tokens"], "coefficients": p_b["coefficients"], "fit": p_b["fit"]},
    f"{LB} without lone prefills": fit(shapes(nolone), list(nolone.t)),
}
for name, f in fits.items():
    c = ", ".join(f"{k} {1e3 * v:.4g}" for k, v in f["coefficients"].items())
    print(
        f"   {name:25s} knee {f['knee_tokens']:.0f}; {c}; fit {f['fit']['samples']} steps median |err| "
        f"{100 * f['fit']['median_abs_rel_err']:.2f}%"
    )
cal_b["kind_w"] = np.where(cal_b.workload == "lone prefills", "lone prefills", cal_b.kind)
ins = pd.DataFrame({name: (price(f, cal_b) / cal_b.t - 1) for name, f in fits.items()}).groupby(cal_b.kind_w.to_numpy())
print(f"   in-sample on {LB}'s {len(cal_b)} calibration steps (median residual):")
print("   " + ins.median().map(pct).to_string().replace("\n", "\n   "))
res = pd.DataFrame({name: (price(f, st_b) / st_b.measured_s - 1) for name, f in fits.items()}, index=st_b.index)
res[["trace", "kind"]] = st_b[["trace", "kind"]]
table = res.groupby(["trace", "kind"]).median(numeric_only=True).map(pct)
table["steps"] = res.groupby(["trace", "kind"]).size()
print(f"   {LB}'s real steps:")
print("   " + table.to_string().replace("\n", "\n   "))
allk = res.groupby("kind").median(numeric_only=True).map(pct)
print("   " + allk.to_string().replace("\n", "\n   "))
print(
    f"   ({LA}'s real steps priced by {LA}'s profile: "
    + ", ".join(f"{k} {pct(g.median())}" for k, g in (st_a.predicted_s / st_a.measured_s - 1).groupby(st_a.kind))
    + ")\n"
)

print(
    f"5. Lone prefills by prompt tokens: {LB}'s calibration (in-sample residual of each fit; ms per token) and the real"
)
print(f"   c=1 cells' lone prefills of {LA} and {LB} (median residual under each fit)")
bands = [0, 32, 64, 96, 128, 160, 192, 256, 512, 1024]
lone = cal_b[cal_b.workload == "lone prefills"]
t = pd.DataFrame({name: price(f, lone) / lone.t.to_numpy() - 1 for name, f in fits.items()}, index=lone.index)
t["ms/token"] = 1e3 * lone.t / lone.prefill_tokens
g = t.groupby(lone.prefill_tokens)
out = g.median().assign(n=g.size())
print(
    f"   {LB} calibration:\n   "
    + out.apply(lambda c: c.map(pct) if c.name in fits else c.round(2)).to_string().replace("\n", "\n   ")
)
for folder, st in ((A, st_a), (B, st_b)):
    s = st[(st.num_seqs == 1) & (st.kind == "prefill")]
    t = pd.DataFrame({name: price(f, s) / s.measured_s.to_numpy() - 1 for name, f in fits.items()}, index=s.index)
    t["ms/token"] = 1e3 * s.measured_s / s.prefill_tokens
    g = t.groupby([s.trace, pd.cut(s.prefill_tokens, bands)], observed=True)
    out = g.median().assign(n=g.size())
    print(
        f"   {folder.name[:2]} real c=1:\n   "
        + out.apply(lambda c: c.map(pct) if c.name in fits else c.round(2)).to_string().replace("\n", "\n   ")
    )
print()

print("6. Tried, fitted on each calibration like the profile (knee grid, non-negative relative least squares) and")
print("   judged on that study's real busy steps: (a) a second token slope above a break B (64-256 tokens), on all")
print("   tokens or on prefill tokens; (b) the linear term piecewise in the step's tokens (a slope per segment, every")
print(
    "   slope >= 0, so the price still grows with tokens), segments at 64/128/160/256 or at 32/64/96/128/160/192/256/384"
)


def candidate_rows(df: pd.DataFrame, knee: float, extra: str | None, at: list[int]) -> np.ndarray:
    base = feature_rows(shapes(df), knee)
    if extra is None:
        return base
    if extra in ("num_tokens", "prefill_tokens"):
        return np.column_stack([base, np.maximum(0, df[extra].to_numpy(float) - at[0])])
    tokens = df.num_tokens.to_numpy(float)  # extra == "segments": the linear column replaced by one per segment
    edges = [knee, *[b for b in at if b > knee], np.inf]
    parts = [np.clip(tokens - lo, 0, hi - lo) for lo, hi in zip(edges[:-1], edges[1:])]
    return np.column_stack([np.delete(base, 2, axis=1), np.full(len(df), knee), *parts])


def fit_candidate(cal: pd.DataFrame, extra: str | None, grid: list[list[int]]):
    t, best = cal.t.to_numpy(), None
    for knee in np.unique(np.concatenate([[1.0], np.quantile(cal.num_tokens, np.linspace(0, 0.95, 40))])):
        for at in grid:
            x = candidate_rows(cal, knee, extra, at)
            coef = _nnls_relative(x, t)
            err = float(np.sum(((x @ coef - t) / np.maximum(x @ coef, 1e-12)) ** 2))
            if best is None or err < best[0]:
                best = (err, knee, at, coef)
    return best


breaks = [[b] for b in (64, 96, 112, 128, 144, 160, 192, 256)]
candidates = {
    "current": (None, [[]]),
    "break on tokens": ("num_tokens", breaks),
    "break on prefill tokens": ("prefill_tokens", breaks),
    "segments 64-256": ("segments", [[64, 128, 160, 256]]),
    "segments 32-384": ("segments", [[32, 64, 96, 128, 160, 192, 256, 384]]),
}
for folder, cal, st in ((A, cal_a, st_a), (B, cal_b, st_b)):
    res, lines = pd.DataFrame(index=st.index), []
    for name, (extra, grid) in candidates.items():
        err, knee, at, coef = fit_candidate(cal, extra, grid)
        res[name] = candidate_rows(st, knee, extra, at) @ coef / st.measured_s - 1
        if extra is None:
            what = ""
        elif extra == "segments":  # after step, seqs, logits, pairs, context: the flat part, then one slope each
            what = f", at {at}; ms per token below the knee, then per segment: " + ", ".join(
                f"{1e3 * c:.3g}" for c in coef[5:]
            )
        else:
            what = f", at {at}; its slope {1e3 * coef[-1]:.3g} ms per token"
        lines.append(f"   {folder.name[:2]} {name}: objective {err:.3f} (knee {knee:.0f}{what})")
    print("\n".join(lines))
    by_kind = res.groupby([st.trace, st.kind]).agg(lambda x: f"{pct(x.median())} |{100 * x.abs().median():.1f}|")
    print("   median residual |median abs| of the real busy steps:\n   " + by_kind.to_string().replace("\n", "\n   "))
    nd = st.kind != "decode"
    band = res[nd].groupby(pd.cut(st[nd].prefill_tokens, [0, 32, 64, 96, 128, 160, 192, 256, 512]), observed=True)
    print(
        "   steps with prefill work, median residual by prefill tokens:\n   "
        + band.median().map(pct).assign(steps=band.size()).to_string().replace("\n", "\n   ")
    )
print()

print(
    f"7. The profile model's U verdicts in {LB} (raw -> probe-matched [step-matched], real half-width), with each real"
)
print(f"   run's median step residual / busy-time residual / probe ratio, and {LB} / {LA} busy time on identical steps")
d = pd.read_csv(B / "drift_matched.csv")
d = d[(d.cost_model == "profile") & d.metric.isin(TARGETED) & (d.verdict == "unexplained")]
runs = pd.read_csv(B / "probe_gauge_runs.csv")
runs = runs[runs.cost_model == "profile"].set_index(["cell", "repeat"])
busy = st_b.groupby(["cell", "repeat"]).apply(lambda g: g.predicted_s.sum() / g.measured_s.sum() - 1)
for r in d.itertuples():
    per = "; ".join(
        f"{pct(runs.loc[(r.cell, k), 'median_residual'])} / {pct(busy.loc[(r.cell, k)])} / "
        f"{runs.loc[(r.cell, k), 'probe_ratio']:.3f}"
        for k in range(3)
    )
    same = j.loc[r.cell] if r.cell in j.index.get_level_values(0) else None
    ratio = (
        ""
        if same is None or len(same) < len(k_a.loc[r.cell])
        else f"; {LB}/{LA} identical steps {same.measured_s_b.sum() / same.measured_s.sum():.3f}"
    )
    print(
        f"   {r.cell} {r.metric}: {pct(r.raw_error)} -> {pct(r.matched_error)} [{pct(r.step_matched_error)}], h "
        f"{100 * r.real_ci_rel_halfwidth:.0f}%; runs {per}{ratio}"
    )
print()

print("8. Capacity knee inputs: requests of 32 meeting the SLO per open cell, real repeats and raw simulations")
runs = pd.read_csv(B / "runs.csv")
o = runs[(runs["mode"] == "open") & runs.side.isin(["real", "sim"])].copy()
o["who"] = np.where(
    o.side == "real", "real" + o.repeat.fillna(0).astype(int).astype(str), "sim " + o.cost_model.fillna("")
)
o["met"] = (o.slo_attainment * o.completed).round().astype(int)
print(
    "   "
    + o.pivot_table(index=["trace", "level", "offered_rate"], columns="who", values="met", aggfunc="first")
    .to_string()
    .replace("\n", "\n   ")
)
k = pd.read_csv(B / "knee_matched.csv")
for r in k.itertuples():
    print(
        f"   {r.trace} {r.cost_model}: real {r.real_knee_mean:.3f} [{r.real_ci_low:.3f}, {r.real_ci_high:.3f}] (h "
        f"{100 * r.real_ci_rel_halfwidth:.0f}%), raw {r.sim_raw:.3f} ({pct(r.raw_error)}), matched {r.sim_matched:.3f} "
        f"({pct(r.matched_error)}), {r.verdict}"
    )
real_knees = pd.read_csv(B / "knee.csv").drop_duplicates("trace").set_index("trace").real_knees
print("   real knee per repeat: " + "; ".join(f"{t} {v}" for t, v in real_knees.items()))
