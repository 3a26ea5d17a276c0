"""Why the operators cost model under-prices v7's Azure open-loop cells: its step residuals on Azure vs synthetic
cells, whether any step lies outside its microbenchmarks' grid, and the steps with prefill work by their size,
in the study and in the calibration's own steps (in-sample). Measured on the committed tables, no simulation.

    python results/fidelity/v7_2026-12-03/operators_by_prefill.py > results/fidelity/v7_2026-12-03/operators_by_prefill.txt
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.sim.cost_models.operators import Operators
from testbed.sim.shape import StepShape

HERE = Path(__file__).resolve().parent
BANDS = [0, 16, 64, 128, 256, 512]
pd.set_option("display.width", 200)


def kind(prefill_seqs, decode_seqs):
    return np.where(prefill_seqs == 0, "decode", np.where(decode_seqs == 0, "prefill", "mixed"))


st = pd.read_csv(HERE / "step_residuals.csv")
st["res"] = st.predicted_s / st.measured_s - 1
st["trace"] = st.cell.str.split("_").str[0]
profile = json.load(open(next((HERE / "profile").glob("*.json"))))
bench = profile["operators"]["microbenchmarks"]

print("1. Busy real steps, median residual (predicted / measured - 1) and count, by trace and kind:")
print(st.groupby(["trace", "kind", "cost_model"]).res.agg(["median", "size"]).unstack("cost_model").round(3).to_string())
busy = st[st.cost_model == "profile"].groupby(["trace", "kind"]).measured_s.sum()
print("   share of busy time by kind:", (busy / busy.groupby(level=0).transform("sum")).round(3).to_dict(), "\n")

ops = st[st.cost_model == "operators"]
chunk = ops.prefill_tokens / ops.prefill_seqs.where(ops.prefill_seqs > 0)
grid = {
    "tokens > linear grid": (ops.num_tokens, max(r[0] for r in bench["linear"])),
    "logit rows > logits grid": (ops.num_logits, max(r[0] for r in bench["logits"])),
    "mean prefill chunk > attn_prefill grid": (chunk, max(r[0] for r in bench["attn_prefill"])),
    "prefill context > attn_prefill grid": (ops.prefill_context, max(r[1] for r in bench["attn_prefill"])),
    "decode rows > attn_decode grid": (ops.decode_seqs, max(r[0] for r in bench["attn_decode"])),
    "decode context > attn_decode grid": (ops.decode_context, max(r[1] for r in bench["attn_decode"])),
}
print("2. Busy steps outside the operator microbenchmarks' grid (grid maximum in brackets):")
for name, (values, top) in grid.items():
    print(f"   {name} ({top:g}): " + ", ".join(
        f"{t} {int((values[ops.trace == t] > top).sum())} of {int((ops.trace == t).sum())}" for t in ("synthetic", "azure")))
work = ops[ops.prefill_seqs > 0]
print("   prefill tokens per step with prefill work, median / p90 / max:",
      {t: work[work.trace == t].prefill_tokens.quantile([0.5, 0.9, 1.0]).astype(int).tolist() for t in ("synthetic", "azure")})
outputs = {t: pd.concat(pd.read_parquet(f) for f in sorted((HERE / "runs").glob(f"{t}_*/real*/requests.parquet")))
           for t in ("synthetic", "azure")}
print("   output tokens per request (every real run), median / p90:",
      {t: o.output_tokens.quantile([0.5, 0.9]).astype(int).tolist() for t, o in outputs.items()})
print("   linear operator, one layer, microseconds per token at 1/4/16/64/256/512 rows:",
      [round(1e6 * t / x, 1) for x, t in bench["linear"]], "\n")

samples = profile["samples"]
cal = pd.DataFrame(samples["shapes"], columns=samples["features"]).assign(measured_s=samples["seconds"])
model = Operators(profile["operators"])
cal["predicted_s"] = [model.step_time(StepShape(*(int(v) if f != "prefill_pairs" else float(v)
                                                  for f, v in zip(samples["features"], row)))) for row in samples["shapes"]]
cal["res"] = cal.predicted_s / cal.measured_s - 1
cal["kind"] = kind(cal.prefill_seqs, cal.decode_seqs)
print("3. Operators model on the calibration's own 709 steps (in-sample), by kind: median residual, count")
print(cal.groupby("kind").res.agg(["median", "size"]).round(3).to_string())
check = ops.sample(200, random_state=0)
again = [model.step_time(StepShape(*(int(r[f]) if f != "prefill_pairs" else float(r[f]) for f in samples["features"])))
         for _, r in check.iterrows()]
print("   (the same model reproduces step_residuals.csv's operators prices: max |diff| %.1g s over 200 steps)\n"
      % np.max(np.abs(np.array(again) - check.predicted_s.to_numpy())))

print("4. Mixed steps by prefill tokens in the step: median residual (count); calibration = in-sample")
mixed = st[st.kind == "mixed"]
cols = {"calibration operators": cal[cal.kind == "mixed"]}
for cm in ("operators", "profile"):
    for t in ("synthetic", "azure"):
        cols[f"{t} {cm}"] = mixed[(mixed.cost_model == cm) & (mixed.trace == t)]
table = {name: d.groupby(pd.cut(d.prefill_tokens, BANDS), observed=True).res.agg(
    lambda s: f"{s.median():+.3f} ({len(s)})") for name, d in cols.items()}
print(pd.DataFrame(table).to_string(), "\n")

print("5. Open-loop cells: time-weighted residual (sum of prices / sum of measured - 1) over all busy steps and over")
print("   mixed steps; each simulation's busy time and step count against the real runs' mean (summary.json)")
rows = []
for cell in sorted(c for c in st.cell.unique() if "open" in c):
    s = st[st.cell == cell]
    real = [json.load(open(HERE / "runs" / cell / f"real{k}" / "summary.json")) for k in range(3)]
    row = {"cell": cell}
    for cm in ("profile", "operators"):
        g = s[s.cost_model == cm]
        m = g[g.kind == "mixed"]
        sim = json.load(open(HERE / "runs" / cell / f"sim-{cm}" / "summary.json"))
        row[f"{cm} all"] = g.predicted_s.sum() / g.measured_s.sum() - 1
        row[f"{cm} mixed"] = m.predicted_s.sum() / m.measured_s.sum() - 1
        row[f"{cm} busy"] = sim["busy_s"] / np.mean([r["busy_s"] for r in real]) - 1
        row[f"{cm} steps"] = sim["num_steps"] / np.mean([r["num_steps"] for r in real]) - 1
    rows.append(row)
print(pd.DataFrame(rows).set_index("cell").round(3).to_string())
