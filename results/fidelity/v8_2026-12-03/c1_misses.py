"""v8's closed c=1 cells (v7's c1_misses.py with v8 added and the cell as an argument): the lone-prefill price
by prompt length and the request-to-request speed behind the p99 TPOT misses; measured on the committed step
tables, no simulation.

    python results/fidelity/v8_2026-12-03/c1_misses.py > results/fidelity/v8_2026-12-03/c1_misses.txt
    python results/fidelity/v8_2026-12-03/c1_misses.py azure_closed_c1 > results/fidelity/v8_2026-12-03/c1_misses_azure.txt

At c=1 a request's TTFT is one lone prefill step (one sequence, no decode) and its TPOT the mean gap between
its decode steps. Busy steps of each real run's steps.parquet map in order onto step_residuals.csv (checked).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

HERE = Path(__file__).resolve().parent
CELL = sys.argv[1] if len(sys.argv) > 1 else "synthetic_closed_c1"
BANDS = [0, 32, 64, 96, 128, 160, 192, 224, 256, 512]
pd.set_option("display.width", 200)

print("1. Lone prefill steps (1 sequence, no decode), profile model, every cell of each study: median")
print("   residual (predicted / measured - 1) and measured ms per prompt token, by prompt tokens")
tables = {}
for folder in ("v3_2026-12-03", "v4_2026-12-03", "v5_2026-12-03", "v6_2026-12-03", "v7_2026-12-03", "v8_2026-12-03"):
    st = pd.read_csv(HERE.parent / folder / "step_residuals.csv")
    st = st[(st["kind"] == "prefill") & (st["num_seqs"] == 1) & (st["cost_model"] == "profile")]
    st = st.assign(res=st.predicted_s / st.measured_s - 1, ms_tok=1e3 * st.measured_s / st.prefill_tokens)
    g = st.groupby(pd.cut(st.prefill_tokens, BANDS), observed=True)
    tables[folder[:2]] = pd.DataFrame({"n": g.size(), "res": g.res.median(), "ms_tok": g.ms_tok.median()})
print(pd.concat(tables, axis=1).round(3).to_string(), "\n")

profile = json.load(open(next((HERE / "profile").glob("*.json"))))
cal = pd.DataFrame(profile["samples"]["shapes"], columns=profile["samples"]["features"])
lone = cal[(cal.decode_seqs == 0) & (cal.prefill_seqs == 1)]
print("   The calibration's %d steps hold %d lone prefills, of %s tokens (count): %s\n" % (
    len(cal), len(lone), "/".join(str(int(t)) for t in sorted(lone.prefill_tokens.unique())),
    lone.prefill_tokens.astype(int).value_counts().sort_index().to_dict()))

steps_res = pd.read_csv(HERE / "step_residuals.csv")
steps_res = steps_res[(steps_res.cell == CELL) & (steps_res.cost_model == "profile")]
sim = pd.read_parquet(HERE / "runs" / CELL / "sim-profile" / "requests.parquet").set_index("request_id")
sim_ttft = 1e3 * (sim.first_token_time - sim.arrival_time)
sim_tpot = 1e3 * (sim.finish_time - sim.first_token_time) / (sim.output_tokens - 1)
rows = []
for k in range(3):
    run = HERE / "runs" / CELL / f"real{k}"
    steps = pd.read_parquet(run / "steps.parquet")
    busy = steps[(steps.num_running + steps.num_waiting) > 0].copy()
    res = steps_res[steps_res.repeat == k]
    assert (busy.num_prefill_tokens.to_numpy() + busy.num_decode_tokens.to_numpy() == res.num_tokens.to_numpy()).all()
    busy["measured"], busy["ratio"] = res.measured_s.to_numpy(), (res.measured_s / res.predicted_s).to_numpy()
    req = pd.read_parquet(run / "requests.parquet").sort_values("arrival_time").reset_index(drop=True)
    for i, r in req.iterrows():
        mine = busy[busy.scheduled_ids.apply(lambda ids, rid=r.request_id: rid in list(ids))]
        prefill = mine[mine.num_prefill_tokens > 0]
        gaps = 1e3 * np.diff(np.asarray(r.token_times))
        rows.append(
            {
                "repeat": k,
                "order": i,
                "request": r.request_id,
                "prompt": r.prompt_tokens,
                "out": r.output_tokens,
                "ttft": 1e3 * (r.first_token_time - r.arrival_time),
                "prefill_step": 1e3 * prefill.measured.sum(),
                "sim_ttft": sim_ttft[r.request_id],
                "tpot": gaps.mean() if gaps.size else np.nan,  # one output token: no TPOT
                "tpot_clipped": np.where(gaps == gaps.max(), np.median(gaps), gaps).mean() if gaps.size else np.nan,
                "sim_tpot": sim_tpot[r.request_id],
                "speed": mine[mine.num_prefill_tokens == 0].ratio.median(),
                "worst": mine[mine.num_prefill_tokens == 0].ratio.max(),
            }
        )
d = pd.DataFrame(rows)

gap = (d.ttft - d.prefill_step).abs()
print("2. TTFT at c=1 is the lone prefill step: |TTFT - its prefill step's period| max %.2f ms, within 1 ms for %d of"
      " %d requests;" % (gap.max(), (gap < 1).sum(), len(d)))
print("   the simulated TTFT is the profile's price of that step. Simulated / real TTFT - 1 per request, by prompt:")
d["ttft_err"] = d.sim_ttft / d.ttft - 1
g = d.groupby(pd.cut(d.prompt, [0, 64, 128, 192, 256]), observed=True).ttft_err
print(pd.DataFrame({"n": g.size(), "median": g.median()}).round(3).to_string())
print("   real median TTFT per repeat (ms):", d.groupby("repeat").ttft.median().round(1).tolist(),
      "| prompt of the requests within 10 ms of it:",
      sorted(d[(d.ttft - d.groupby("repeat").ttft.transform("median")).abs() < 10].prompt.unique().tolist()),
      "| simulated median TTFT %.1f ms" % sim_ttft.median())
print("   the three slowest TTFTs per repeat (ms) against the profile's price:")
for k, g in d.groupby("repeat"):
    top = g.nlargest(3, "ttft")
    print(f"   repeat {k}: " + "; ".join(
        f"{r.request} prompt {r.prompt}: real {r.ttft:.0f}, priced {r.sim_ttft:.0f} ({r.sim_ttft / r.ttft - 1:+.1%}), "
        f"its decode speed {r.speed:.2f}" for r in top.itertuples()))
print("   real p99 TTFT per repeat (ms):", d.groupby("repeat").ttft.quantile(0.99).round(1).tolist(),
      "simulated %.1f" % np.percentile(sim_ttft, 99), "\n")

print("3. p99 TPOT. Simulated: p99 %.2f ms, median %.2f (the profile's TPOT differs between requests only by"
      % (np.nanpercentile(sim_tpot, 99), np.nanmedian(sim_tpot)))
print("   context). Real per repeat: p99, median, p99 with each request's slowest gap set to its median gap, and")
print("   the run's slowest decode step / its price (speed = a request's decode steps' median measured / price):")
for k, g in d.groupby("repeat"):
    top = g.nlargest(3, "tpot")
    print(f"   repeat {k}: p99 {np.nanpercentile(g.tpot, 99):.2f}, median {g.tpot.median():.2f}, clipped p99 "
          f"{np.nanpercentile(g.tpot_clipped, 99):.2f}, slowest step {g.worst.max():.2f}x; request speeds median {g.speed.median():.3f}, top-3 TPOT requests "
          + ", ".join(f"{r.tpot:.2f} ms at speed {r.speed:.3f}" for r in top.itertuples()))
t = d.dropna(subset=["tpot", "speed"])  # requests of one output token have neither
rho_p = stats.spearmanr(t.prompt, t.speed)
rho_o = stats.spearmanr(t.out, t.speed)
rho_t = stats.spearmanr(t.speed, t.tpot / t.groupby("repeat").tpot.transform("median"))
print("   request speed: median %.3f, p90 %.3f, max %.3f (%d requests)" % (d.speed.median(), d.speed.quantile(0.9),
                                                                          d.speed.max(), len(d)))
print("   Spearman: TPOT / its run's median vs speed %+.2f (p %.1g); speed vs prompt %+.2f (p %.2f), vs output %+.2f"
      " (p %.2f)" % (rho_t[0], rho_t[1], rho_p[0], rho_p[1], rho_o[0], rho_o[1]))
print("   lag-1 autocorrelation of speed in arrival order, per repeat:",
      [round(float(g.sort_values("order").speed.autocorr(1)), 2) for _, g in d.groupby("repeat")])
