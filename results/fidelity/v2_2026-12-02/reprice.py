"""Re-price v2's real steps with refits of the whole-step profile model (the README's "Where the decode
over-pricing comes from"). v2's step_residuals.csv kept no full shapes, so each busy real step's StepShape is
rebuilt from runs/*/real*/steps.parquet and requests.parquet (synthetic prompts: no prefix-cache hits);
the rebuilt shapes reproduce the study's own residuals. Deterministic, no engine run.

    python results/fidelity/v2_2026-12-02/reprice.py > results/fidelity/v2_2026-12-02/reprice.txt
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from testbed.sim.cost_models.profile import _nnls_relative, feature_rows, fit
from testbed.sim.shape import StepShape

HERE = Path(__file__).parent
PROFILE = HERE.parents[1] / "profiles" / "cpu-amd-epyc-smollm2-135m-cpu-float32.json"  # the v2 calibration


def study_steps() -> pd.DataFrame:
    rows = []
    for path in sorted(HERE.glob("runs/*/real*/steps.parquet")):
        steps = pd.read_parquet(path).sort_values("start_time").reset_index(drop=True)
        requests = pd.read_parquet(path.with_name("requests.parquet"))
        assert requests["cached_tokens"].sum() == 0, path
        prompt = dict(zip(requests["request_id"], requests["prompt_tokens"]))
        period = steps["start_time"].shift(-1) - steps["start_time"]
        computed: dict = {}
        generated: dict = {}
        for i, s in steps.iterrows():
            for rid in s["preempted_ids"] if s["preempted_ids"] is not None else []:
                computed[rid] = 0
            pf_seqs = pf_tok = pf_ctx = dc_seqs = dc_tok = dc_ctx = logits = 0
            pf_pairs = 0.0
            for rid, n in zip(s["scheduled_ids"], s["scheduled_tokens"]):  # as StepShape.of
                c, known = computed.get(rid, 0), prompt[rid] + generated.get(rid, 0)
                if c >= known - 1:
                    dc_seqs, dc_tok, dc_ctx, logits = (
                        dc_seqs + 1,
                        dc_tok + n,
                        dc_ctx + n * c + n * (n + 1) // 2,
                        logits + n,
                    )
                else:
                    pf_seqs, pf_tok, pf_pairs, pf_ctx = (
                        pf_seqs + 1,
                        pf_tok + n,
                        pf_pairs + n * (c + (n + 1) / 2),
                        pf_ctx + c + n,
                    )
                    logits += max(0, c + n - known + 1)
                computed[rid] = c + n
                if c + n >= known:
                    generated[rid] = generated.get(rid, 0) + 1
            busy = s["num_running"] + s["num_waiting"] > 0  # as the study: no idle wait in the period
            if i + 1 < len(steps) and busy:
                shape = StepShape(
                    len(s["scheduled_ids"]),
                    pf_tok + dc_tok,
                    logits,
                    pf_seqs,
                    pf_tok,
                    pf_pairs,
                    pf_ctx,
                    dc_seqs,
                    dc_tok,
                    dc_ctx,
                )
                kind = "decode" if pf_seqs == 0 else ("prefill" if dc_seqs == 0 else "mixed")
                rows.append(
                    {
                        "cell": path.parts[-3],
                        "repeat": int(path.parts[-2][4:]),
                        "kind": kind,
                        "t": period[i],
                        "shape": shape,
                    }
                )
    return pd.DataFrame(rows)


def medians(steps, knee, coef) -> dict:
    res = feature_rows(list(steps["shape"]), knee) @ coef / steps["t"].to_numpy() - 1
    return {k: f"{100 * np.median(res[steps['kind'] == k]):+.1f}%" for k in ("decode", "mixed", "prefill")}


def main() -> None:
    profile = json.loads(PROFILE.read_text())
    samples = profile["samples"]
    shapes = [StepShape(*r) for r in samples["shapes"]]
    t = np.array(samples["seconds"])
    workload = np.array(samples["workload"])
    steps = study_steps()
    coef = np.array(list(profile["coefficients"].values()))
    print(f"{len(steps)} busy real steps; committed profile: {medians(steps, profile['knee_tokens'], coef)}")
    for repeat in (0, 1, 2):
        print(f"  repeat {repeat}: {medians(steps[steps['repeat'] == repeat], profile['knee_tokens'], coef)}")
    first = steps["repeat"] == 0
    print(f"  repeats 1-2: {medians(steps[~first], profile['knee_tokens'], coef)}")
    for knee in (1, 4, 5, 6, 8, 10, 12, 16):  # the knee forced
        c = _nnls_relative(feature_rows(shapes, knee), t)
        print(f"knee {knee}: {medians(steps, knee, c)}")
    decode = np.array([s.prefill_seqs == 0 for s in shapes])
    r = fit([s for s, d in zip(shapes, decode) if d], list(t[decode]))
    print(f"decode-only fit: {medians(steps, r['knee_tokens'], np.array(list(r['coefficients'].values())))}")
    keep = ~np.isin(workload, ["decode b=32 ctx=1000", "decode b=64 ctx=1000"])
    r = fit([s for s, k in zip(shapes, keep) if k], list(t[keep]))
    print(
        f"without decode b=32/64 at ctx=1000 ({keep.sum()} of {len(t)} samples): fit median |error| "
        f"{100 * r['fit']['median_abs_rel_err']:.1f}%, held out "
        f"{medians(steps, r['knee_tokens'], np.array(list(r['coefficients'].values())))}"
    )


if __name__ == "__main__":
    main()
