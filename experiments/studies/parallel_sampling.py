"""Memory saved by parallel sampling's shared prompt blocks: the shape of the PagedAttention paper's Fig. 15.

    python -m experiments.studies.parallel_sampling [--repeats 5] [--requests 200] [--out results/parallel_sampling]

Kwon et al., SOSP'23, Sec. 6.3: "Fig. 15 plots the amount of memory saving, computed by the number of blocks
we saved by sharing divided by the number of total blocks without sharing": 6.1%-9.8% on Alpaca and
16.2%-30.5% on ShareGPT for parallel sampling (n = 2, 4, 6; OPT-13B, their serving runs).

What runs: this engine with the host executor (no model: memory is what is measured; the KV allocator,
scheduler and fork are the real ones), block_size 16 (the paper's), a cache large enough that nothing waits
or is preempted, requests arriving as a Poisson process in engine steps, every sequence generating exactly
its output length (ignore_eos). Per workload, n and repeat (a fresh workload seed each), three systems over
the same requests:
    fork         one request with n (testbed.sequence_group: prompt blocks shared, the partial one copied on
                 write), prefix caching off, so the fork is the only sharing
    independent  n requests with the same prompt each, prefix caching off: no sharing
    prefix       n requests with the same prompt, prefix caching on: vLLM v1's way (full blocks shared
                 through the prefix cache, the partial block recomputed by each)
Measures, over all steps of a run (block-steps: memory x time):
    saving_in_run   1 - sum(blocks in use) / sum(blocks the sequences hold, a shared block counted per
                    holder) in the fork run: the paper's definition, the same schedule on both sides
    saving_vs_indep 1 - sum(used, fork) / sum(used, independent): two runs of the same requests
    saving_prefix   1 - sum(used, prefix) / sum(used, independent)
Mean and 95% t-interval over repeats. Lengths: lognormal with the workload's mean (sigma below, an assumption:
the paper gives the means, ours are from its Fig. 11), clamped to a 2048-token context as OPT's.
Writes savings.csv, runs.csv, README.md and savings.png in --out.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.results.environment import environment
from experiments.results.files import write_json
from experiments.statistics.intervals import ci95
from experiments.traces.synthetic import sample_lengths
from testbed import Engine, EngineConfig, SamplingParams

MAX_MODEL_LEN = 2048
BLOCK_SIZE = 16
NS = (2, 4, 6)
# mean prompt / output tokens: the PagedAttention paper's Fig. 11 (ShareGPT 161.31 / 337.99, Alpaca 19.31 /
# 58.45; its Sec. 6.1: ShareGPT has 8.4x longer prompts and 5.8x longer outputs than Alpaca). Sigmas: ours.
WORKLOADS = {
    "alpaca": dict(prompt_mean=19.31, output_mean=58.45, prompt_sigma=0.6, output_sigma=0.9),
    "sharegpt": dict(prompt_mean=161.31, output_mean=337.99, prompt_sigma=1.0, output_sigma=0.9),
}
PAPER_SAVING = {"alpaca": (0.061, 0.098), "sharegpt": (0.162, 0.305)}  # Sec. 6.3, over n = 2..6
SYSTEMS = ("fork", "independent", "prefix")
CONCURRENCY = 24  # mean requests in flight: arrival rate = CONCURRENCY / mean output length (per step)


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
    arrival_steps: list[int]


def make_workload(name: str, num_requests: int, seed: int, fixed: bool = False) -> Workload:
    """Lognormal lengths with the workload's means, or (fixed) every length at its mean, rounded."""
    spec = WORKLOADS[name]
    rng = np.random.default_rng(seed)

    def lengths(kind: str, cap: int | None = None) -> np.ndarray:
        mean, sigma = spec[f"{kind}_mean"], spec[f"{kind}_sigma"]
        dist = {"dist": "fixed", "value": round(mean)} if fixed else {"dist": "lognormal", "mean": mean, "sigma": sigma}
        return sample_lengths({**dist, **({"max": cap} if cap else {})}, num_requests, rng, kind)

    prompt_lens = lengths("prompt", MAX_MODEL_LEN // 2)
    output_lens = lengths("output")
    output_lens = np.minimum(output_lens, MAX_MODEL_LEN - prompt_lens)
    rate = CONCURRENCY / spec["output_mean"]
    arrivals = np.floor(np.cumsum(rng.exponential(1 / rate, num_requests))).astype(int)
    # distinct prompts (no accidental prefix sharing between requests): token ids from the request's own range
    prompts = [[int(t) for t in rng.integers(3, 4000, size=int(n))] for n in prompt_lens]
    return Workload(prompts, [int(o) for o in output_lens], [int(a) for a in arrivals])


def run(system: str, n: int, w: Workload) -> dict:
    """One replay; per-step blocks in use and blocks held (per holder), summed over the run."""
    engine = Engine(
        EngineConfig(
            model="tiny",
            executor="host",
            block_size=BLOCK_SIZE,
            num_blocks=60_000,  # no request ever waits for memory (asserted below)
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=4096,
            max_num_batched_tokens=16_384,
            enable_prefix_caching=system == "prefix",
        )
    )
    kv, sched = engine.kv, engine.scheduler
    order = list(range(len(w.prompts)))
    used = held = steps = peak = 0
    step, i = 0, 0
    while i < len(order) or engine.has_unfinished():
        while i < len(order) and w.arrival_steps[i] <= step:
            max_tokens = w.output_lens[i]
            if system == "fork":
                engine.add_request(str(i), w.prompts[i], SamplingParams(n=n, max_tokens=max_tokens, ignore_eos=True))
            else:
                for j in range(n):
                    engine.add_request(f"{i}.{j}", w.prompts[i], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            i += 1
        if engine.has_unfinished():
            engine.step()
            assert sched.num_preemptions == 0 and sched.num_waiting == 0, "the cache was meant to be ample"
            in_use = kv.num_blocks - kv.num_free_blocks
            used += in_use
            held += kv.num_held_blocks_total
            peak = max(peak, in_use)
            steps += 1
        step += 1
    kv.pool.check_invariants()
    assert kv.num_free_blocks == kv.num_blocks
    return {
        "block_steps_used": used,
        "block_steps_held": held,
        "steps": steps,
        "peak_blocks": peak,
        "cow_copies": kv.num_cow_copies,
    }


def measure(repeats: int, num_requests: int) -> pd.DataFrame:
    """Lognormal lengths, `repeats` workloads each; then the lengths fixed at the means (one workload: only
    the arrival times would change between repeats, and without queueing they do not change the memory)."""
    rows = []
    cases = [(name, False, rep) for name in WORKLOADS for rep in range(repeats)]
    cases += [(name, True, 0) for name in WORKLOADS]
    for name, fixed, rep in cases:
        w = make_workload(name, num_requests, seed=1000 * rep + 17, fixed=fixed)
        label = f"{name}/fixed" if fixed else name
        for n in NS:
            res = {s: run(s, n, w) for s in SYSTEMS}
            fork, indep, prefix = res["fork"], res["independent"], res["prefix"]
            rows.append(
                {
                    "workload": label,
                    "n": n,
                    "repeat": rep,
                    "mean_prompt": float(np.mean([len(p) for p in w.prompts])),
                    "mean_output": float(np.mean(w.output_lens)),
                    "saving_in_run": 1 - fork["block_steps_used"] / fork["block_steps_held"],
                    "saving_vs_indep": 1 - fork["block_steps_used"] / indep["block_steps_used"],
                    "saving_prefix": 1 - prefix["block_steps_used"] / indep["block_steps_used"],
                    "peak_saving_vs_indep": 1 - fork["peak_blocks"] / indep["peak_blocks"],
                    "steps_fork": fork["steps"],
                    "steps_indep": indep["steps"],
                    "cow_copies": fork["cow_copies"],
                    **{f"block_steps_{s}": res[s]["block_steps_used"] for s in SYSTEMS},
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if not k.startswith("block_steps")}), flush=True)
    return pd.DataFrame(rows)


COLUMNS = ("saving_in_run", "saving_vs_indep", "saving_prefix", "peak_saving_vs_indep")


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (name, n), g in runs.groupby(["workload", "n"], sort=False):
        row = {"workload": name, "n": n, "repeats": len(g)}
        for col in COLUMNS:
            row[col], row[f"{col}_ci95"] = ci95(g[col])
        row["paper_range"] = "{:.1%}-{:.1%} (n=2..6)".format(*PAPER_SAVING[name.split("/")[0]])
        out.append(row)
    return pd.DataFrame(out)


def markdown(summary: pd.DataFrame, env: dict, args) -> str:
    lines = [
        "# Parallel sampling: memory saved by sharing the prompt's KV blocks (PagedAttention Fig. 15)",
        "",
        f"`python -m experiments.studies.parallel_sampling --repeats {args.repeats} --requests {args.requests}`",
        f"({env['date']}, commit {env['git']}, {env['cpu']}, torch {env['torch']}, load average "
        f"{env['load_average']}; memory counts do not depend on the load).",
        "",
        "Saving = blocks saved by sharing / blocks without sharing, over the whole run (block-steps); mean and "
        "95% t-interval over repeats (fresh workload each). `in_run`: the fork run's blocks in use vs the blocks "
        "its sequences hold counted per holder (the paper's definition); `vs_indep`: the fork run vs n independent "
        "requests per prompt (same requests, separate run); `prefix`: n independent requests with prefix caching "
        "on (vLLM v1's sharing) vs without; `peak`: peak blocks, fork vs independent.",
        "",
        "| workload | n | saving in run | vs independent | prefix caching (v1) | peak | paper (Fig. 15) |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in summary.iterrows():
        cells = [
            f"{r[c]:.1%}" + (f" ± {r[f'{c}_ci95']:.1%}" if r[f"{c}_ci95"] == r[f"{c}_ci95"] else "") for c in COLUMNS
        ]
        lines.append(f"| {r['workload']} | {r['n']} | " + " | ".join(cells) + f" | {r['paper_range']} |")
    lines += ["", "![savings](savings.png)", ""]
    return "\n".join(lines)


def plot(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(9, 3.2), sharey=False)
    for ax, name in zip(axes, WORKLOADS):
        s = summary[summary["workload"] == name]
        x = np.arange(len(s))
        for k, (col, label) in enumerate(
            (("saving_vs_indep", "fork + copy on write"), ("saving_prefix", "prefix cache (v1)"))
        ):
            ax.bar(x + (k - 0.5) * 0.38, 100 * s[col], 0.38, yerr=100 * s[f"{col}_ci95"], label=label, capsize=3)
        lo, hi = PAPER_SAVING[name]
        ax.axhspan(100 * lo, 100 * hi, color="grey", alpha=0.2, label="paper, n=2..6")
        ax.set_xticks(x, [f"n={n}" for n in s["n"]])
        ax.set_title(name)
        ax.set_ylabel("blocks saved vs n requests (%)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--out", default="results/parallel_sampling")
    ap.add_argument("--replot", action="store_true", help="only redraw savings.png from the runs.csv in --out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        plot(summarise(pd.read_csv(out / "runs.csv")), out / "savings.png")
        return
    env = environment()
    runs = measure(args.repeats, args.requests)
    summary = summarise(runs)
    runs.to_csv(out / "runs.csv", index=False, float_format="%.5f")
    summary.to_csv(out / "savings.csv", index=False, float_format="%.5f")
    write_json(out / "environment.json", {**env, "args": vars(args)})
    plot(summary, out / "savings.png")
    md = markdown(summary, env, args)
    (out / "table.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
