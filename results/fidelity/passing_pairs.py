"""The README's target check across studies: per pair of studies and cost model, the targeted figures (median and
p99 of TTFT, TPOT, E2EL) of the cells both studies ran, met (raw error within the target) in both / one / neither,
raw errors of the same sign, U in each; then three studies together (TRIPLES).

    python results/fidelity/passing_pairs.py > results/fidelity/passing_pairs.txt

Reads each folder's drift_matched.csv (written by experiments.studies.fidelity_reanalyze).
"""

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
TARGETED = ["median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms"]
PAIRS = [
    ("v6_2026-12-03", "v7_2026-12-03"),
    ("v2_2026-12-02", "v6_2026-12-03"),
    ("v2_2026-12-02", "v7_2026-12-03"),
    ("v3_2026-12-03", "v7_2026-12-03"),
    ("v7_2026-12-03", "v8_2026-12-03"),
    ("v6_2026-12-03", "v8_2026-12-03"),
    ("v8_2026-12-03", "v9_2026-12-03"),
    ("v7_2026-12-03", "v9_2026-12-03"),
    ("v9_knee_low_2026-12-03", "v10_knee_2026-12-03"),
    ("v11_synth_knee_high_2026-12-04/refit_curve", "v12_synth_knee_2026-12-04"),
    ("v11_synth_knee_high_2026-12-04", "v12_synth_knee_2026-12-04"),
    ("v12_azure_knee_2026-12-04", "v13_azure_knee_2026-12-04"),
    ("v14_azure_2026-12-04", "v15_2026-12-04/azure"),
    ("v14_synth_knee_2026-12-04", "v15_2026-12-04/synthetic"),
    ("v16_synth_2026-12-04", "v17_2026-12-04/synthetic"),
    ("v17_2026-12-04/azure", "v18_2026-12-04/azure"),
    ("v17_2026-12-04/synthetic", "v18_2026-12-04/synthetic"),
    ("v17_2026-12-04/synthetic_low", "v18_2026-12-04/synthetic_low"),
]
TRIPLES = [
    ("v2_2026-12-02", "v6_2026-12-03", "v7_2026-12-03"),
    ("v6_2026-12-03", "v7_2026-12-03", "v8_2026-12-03"),
    ("v7_2026-12-03", "v8_2026-12-03", "v9_2026-12-03"),
    ("v16_synth_2026-12-04", "v17_2026-12-04/synthetic", "v18_2026-12-04/synthetic"),
]


def label(folder: str) -> str:
    """v9_knee_low_2026-12-03 -> v9_knee_low: the folder name without its date (a re-analysis in a subfolder,
    v11_x_2026-12-04/refit_curve -> v11_x/refit_curve)."""
    study, _, sub = folder.partition("/")
    return study.rsplit("_", 1)[0] + (f"/{sub}" if sub else "")


def load(folder: str) -> pd.DataFrame:
    df = pd.read_csv(HERE / folder / "drift_matched.csv")
    return df[df.metric.isin(TARGETED)].set_index(["cell", "cost_model", "metric"])


for first, second in PAIRS:
    a, b = load(first), load(second)
    both = a.index.intersection(b.index)
    for model in ("profile", "operators"):
        idx = [i for i in both if i[1] == model]
        x, y = a.loc[idx], b.loc[idx]
        ma, mb = x.verdict.eq("met"), y.verdict.eq("met")
        print(f"{label(first)} + {label(second)} {model}: n {len(idx)}, met in both {(ma & mb).sum()}, one {(ma ^ mb).sum()}, "
              f"neither {(~ma & ~mb).sum()}, same sign {(x.raw_error * y.raw_error > 0).sum()}, "
              f"U {x.verdict.eq('unexplained').sum()} / {y.verdict.eq('unexplained').sum()}")
        per = []
        for metric in TARGETED:
            pm, qm = ma.xs(metric, level=2), mb.xs(metric, level=2)
            per.append(f"{metric} {(pm & qm).sum()}/{(pm ^ qm).sum()}/{(~pm & ~qm).sum()}")
        print("   both/one/neither per metric: " + ", ".join(per))

for triple in TRIPLES:
    studies = {label(name): load(name) for name in triple}
    first, *rest = studies.values()
    shared = first.index
    for other in rest:
        shared = shared.intersection(other.index)
    for model in ("profile", "operators"):
        idx = [i for i in shared if i[1] == model]
        met = pd.DataFrame({k: d.loc[idx, "verdict"].eq("met") for k, d in studies.items()}).sum(axis=1)
        sign = pd.DataFrame({k: d.loc[idx, "raw_error"] for k, d in studies.items()})
        same = ((sign > 0).all(axis=1) | (sign < 0).all(axis=1)).sum()
        print(f"{' + '.join(studies)} {model}: n {len(idx)}, met in 3 / 2 / 1 / 0 studies: "
              + " / ".join(str((met == k).sum()) for k in (3, 2, 1, 0)) + f", same sign in all three {same}")
