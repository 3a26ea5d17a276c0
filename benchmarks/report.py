"""The markdown of benchmarks/throughput.py's results: the throughput table (ratios to transformers and the
roofline) and the fixed-shape table (this engine beside llama.cpp at each number of parallel sequences)."""

from benchmarks.common import markdown_table
from experiments.statistics.intervals import t_interval


def best_rows(all_runs: dict, order: list[str]) -> list[dict]:
    """One row per label: its fastest run, with every run's rate and time listed."""
    rows = []
    rank = {name: i for i, name in enumerate(order)}
    for _label, results in sorted(all_runs.items(), key=lambda kv: (rank[kv[0].split(" ")[0]], kv[0])):
        done = [r for r in results if "output_tok_s" in r]
        best = max(done, key=lambda r: r["output_tok_s"]) if done else results[-1]
        rows.append(
            dict(
                best,
                runs_tok_s=[round(r.get("output_tok_s", 0.0), 2) for r in results],
                runs_s=[round(r["elapsed_s"], 2) if "elapsed_s" in r else None for r in results],
            )
        )
    return rows


def throughput_table(rows: list[dict], bound: dict | None) -> str:
    ok = [r for r in rows if "output_tok_s" in r]
    best_static = max((r["output_tok_s"] for r in ok if r["system"].startswith("hf-static")), default=None)
    cb = next((r["output_tok_s"] for r in ok if r["system"] == "hf-cb"), None)
    llama = next((r["output_tok_s"] for r in ok if r["system"] == "llamacpp"), None)
    table_rows = []
    for r in rows:
        if "output_tok_s" not in r:
            table_rows.append([r["system"], "-", "-", "-", "-", "-", "-", r.get("error", "")])
            continue
        v = r["output_tok_s"]
        table_rows.append(
            [
                r["system"],
                v,
                r["elapsed_s"],
                f"{v / best_static:.2f}x" if best_static else "-",
                f"{v / cb:.2f}x" if cb else "-",
                f"{v / llama:.2f}x" if llama else "-",
                f"{100 * v / bound['bound_output_tok_s']:.1f}%" if bound else "-",
                r.get("note", "") + (f"; runs: {r['runs_tok_s']}" if len(r["runs_tok_s"]) > 1 else ""),
            ]
        )
    return markdown_table(
        ["system", "output tok/s", "time (s)", "vs best hf-static", "vs hf-cb", "vs llamacpp", "of roofline", "notes"],
        table_rows,
    )


def paired_rounds(all_runs: dict, bounds: list[dict | None]) -> list[str]:
    """Each run against its own round: the roofline from the device measured at that round's start
    (bounds[round - 1]) and the best hf-static batch size's run of the same round. On a shared machine whose
    speed drifts, these pairs show the spread that a best-of-runs table hides; their mean and its 95% Student
    t interval (rounds taken as independent repeats) are what a target such as ">= 60% of roofline" is
    judged by."""
    static = {
        label: {r["run"]: r["output_tok_s"] for r in runs if "output_tok_s" in r}
        for label, runs in all_runs.items()
        if label.startswith("hf-static")
    }
    ref = max(static, key=lambda label: max(static[label].values(), default=0.0), default=None)
    lines = []
    for label, runs in all_runs.items():
        parts, of_roofline, vs_ref = [], [], []
        for r in (r for r in runs if "output_tok_s" in r):
            bits = []
            bound = bounds[r["run"] - 1] if r["run"] <= len(bounds) else None
            if bound:
                of_roofline.append(100 * r["output_tok_s"] / bound["bound_output_tok_s"])
                bits.append(f"{of_roofline[-1]:.0f}% of roofline")
            if ref and label != ref and r["run"] in static[ref]:
                vs_ref.append(r["output_tok_s"] / static[ref][r["run"]])
                bits.append(f"{vs_ref[-1]:.2f}x {ref}")
            if bits:
                parts.append(f"run {r['run']} " + ", ".join(bits))
        if len(parts) > 1:
            summary = [_mean_interval(of_roofline, "{:.1f}%", "of roofline"), _mean_interval(vs_ref, "{:.2f}x", ref)]
            lines.append(f"- {label}: " + "; ".join(parts) + "".join(f"; {s}" for s in summary if s))
    if not lines:
        return []
    return ["Each run against its own round (device measured at the round's start):", "", *lines, ""]


def _mean_interval(values: list[float], fmt: str, what: str | None) -> str:
    if len(values) < 2:
        return ""
    low, high = t_interval(values)
    mean = sum(values) / len(values)
    return f"**mean {fmt.format(mean)} {what}** (95% CI {fmt.format(low)} to {fmt.format(high)}, {len(values)} runs)"


def roofline_line(bound: dict, device_numbers: dict, max_num_seqs: int) -> str:
    return (
        f"Roofline bound for this workload: {bound['bound_output_tok_s']:,.0f} output tok/s "
        f"(memory {bound['t_memory_s']:.2f} s: {bound['bytes'] / 1e9:.1f} GB over "
        f"{device_numbers['bandwidth_Bps'] / 1e9:.0f} GB/s measured ({device_numbers['copy']}); "
        f"compute {bound['t_compute_s']:.2f} s: {bound['flops'] / 1e12:.1f} TFLOP over "
        f"{device_numbers['flops_per_s'] / 1e12:.2f} TFLOP/s measured ({device_numbers['matmul']})). "
        f"Memory: weights once per forward, >= {bound['min_forwards']} forwards (longest output, or "
        f"outputs / max_num_seqs={max_num_seqs}), plus each decode token's context KV."
    ) + _measurements_note(device_numbers)


def _measurements_note(device_numbers: dict) -> str:
    n = device_numbers.get("measurements", 1)
    if n < 2:
        return ""
    lo, hi = device_numbers["flops_range"]
    return (
        f" Rates: the fastest of {n} measurements, one per round (matmul {lo / 1e12:.2f}-{hi / 1e12:.2f} TFLOP/s), "
        "so a slow moment of the machine does not loosen the bound."
    )


def shape_table(rows: list[dict]) -> str:
    """Per parallel-sequence count: total time, throughput, TTFT, TPOT, and llama.cpp's total / ours."""
    llama = [r for r in rows if r["system"].startswith("llamacpp") and "elapsed_s" in r]
    llama_total = {r["parallel"]: r["elapsed_s"] for r in llama}
    table_rows = []
    for r in sorted(rows, key=lambda r: (r["parallel"], r["system"])):
        if "elapsed_s" not in r:
            table_rows.append([r["system"].split(" ")[0], r["parallel"], "-", "-", "-", "-", "-", r.get("error", "")])
            continue
        other = llama_total.get(r["parallel"])
        runs = [t for t in r["runs_s"] if t is not None]
        table_rows.append(
            [
                r["system"].split(" ")[0],
                r["parallel"],
                r["elapsed_s"],
                r["output_tok_s"],
                r.get("ttft_s") if r.get("ttft_s") is not None else "-",
                r.get("tpot_ms") if r.get("tpot_ms") is not None else "-",
                f"{other / r['elapsed_s']:.2f}x" if other else "-",
                r.get("note", "") + (f"; runs (s): {runs}" if len(runs) > 1 else ""),
            ]
        )
    return markdown_table(
        [
            "system",
            "parallel",
            "total (s)",
            "output tok/s",
            "mean TTFT (s)",
            "mean TPOT (ms)",
            "llamacpp time / this",
            "notes",
        ],
        table_rows,
    )


def environment_lines(env: dict, threads, thread_timings: dict, repeats: int) -> list[str]:
    return [
        f"- device: {env['device']}; cpu: {env['cpu']} ({env['cpu_count']} cores)",
        f"- versions: python {env['python']}, torch {env['torch']}, triton {env['triton']}, "
        f"transformers {env['transformers']}, cuda {env['cuda']}"
        + (f"; llama.cpp: {env['llama_cpp']}" if env.get("llama_cpp") else ""),
        f"- date: {env['date']}; git {env['git']}; command: `{env['command']}`",
        f"- load average (1/5/15 min) at start: {env['load_average']}; at end: {env['load_average_after']}; "
        f"per system in the JSON (the CPU machine is shared with other engineers' test runs)",
        f"- threads for every system (torch, and llama.cpp's -t/-tb): {threads}"
        + (f" (picked by timing 1 vs all cores: {thread_timings})" if thread_timings else ""),
        f"- {repeats} interleaved run(s) per system (order reversed on every other round); the table shows "
        f"each system's best run",
        "- each system runs in its own process after a warm-up; time = submitting all requests to the "
        "last token (hf-static: all batches back to back; llama-batched-bench: its T = T_PP + T_TG); one-off "
        "builds and compiles happen before and are reported apart (`kernel_build_s` in the JSON)",
    ]
