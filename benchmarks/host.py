"""The engine's host-side cost per decode step, with the host executor (no model runs).

A step here is schedule + KV-cache bookkeeping + input preparation (the real `prepare_inputs`, block
tables and staging, host half only) + output handling, at a steady state of N running requests, each
decoding one token per step. Phases are timed by wrapping the scheduler's and executor's methods.

    python -m benchmarks.host                       # 64, 256, 1024 running; writes results/host_overhead/
    python -m benchmarks.host --running 256 --steps 300 --out /tmp/host
    python -m benchmarks.host --baseline OLD/host_overhead.json   # + a before/after table
    python -m benchmarks.host --ab main --rounds 5  # A-B-A against a git revision, interleaved (host_ab.md)

The baseline is a host_overhead.json written by this script at an earlier commit (e.g. run from a
`git archive` export of it, on the same machine, just before), matched row by row.
"""

import argparse
import gc
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.common import (
    environment,
    load_average,
    markdown_table,
    write_json,
)
from experiments.results.atomic import atomic_write_text

RESULTS = Path(__file__).resolve().parents[1] / "results" / "host_overhead"


def make_steady_engine(
    num_running: int, block_size: int = 16, seed: int = 0, prompt_range=(100, 1024), **engine_options
):
    """An engine (tiny model, host executor) with num_running requests all past prefill, decoding;
    engine_options: more EngineConfig fields (e.g. host_step_time_s, async_scheduling)."""
    from testbed import Engine, EngineConfig, SamplingParams

    rng = random.Random(seed)
    prompts = [[rng.randrange(4096) for _ in range(rng.randint(*prompt_range))] for _ in range(num_running)]
    headroom = 4096  # decode steps the engine can run before blocks run out
    num_blocks = sum(-(-(len(p) + headroom) // block_size) for p in prompts) + 16
    engine = Engine(
        EngineConfig(
            model="tiny",
            executor="host",
            block_size=block_size,
            num_blocks=num_blocks,
            max_num_seqs=num_running,
            max_num_batched_tokens=max(8192, num_running),
            max_model_len=8192,
            device="cpu",
            **engine_options,
        )
    )
    params = SamplingParams(max_tokens=headroom, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    assert engine.scheduler.num_running == num_running
    return engine


def measure(num_running: int, steps: int, gc_freeze: bool = False) -> dict:
    engine = make_steady_engine(num_running)
    if gc_freeze:  # long-lived objects out of the collector's way
        gc.collect()
        gc.freeze()
    phases = {"schedule": [], "execute (input prep)": [], "update": []}

    def timed(obj, name, key):
        fn = getattr(obj, name)

        def wrapper(*a, **kw):
            t = time.perf_counter()
            result = fn(*a, **kw)
            phases[key].append(time.perf_counter() - t)
            return result

        setattr(obj, name, wrapper)

    timed(engine.scheduler, "schedule", "schedule")
    timed(engine.executor, "execute", "execute (input prep)")
    timed(engine.scheduler, "update", "update")
    for values in phases.values():
        values.clear()
    totals = []
    gc.collect()
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        totals.append(time.perf_counter() - t)
        assert engine.last_stats.num_decode_tokens == num_running
    if gc_freeze:
        gc.unfreeze()
    rest = [tot - sum(p[i] for p in phases.values()) for i, tot in enumerate(totals)]
    us = lambda xs: 1e6 * statistics.median(xs)
    result = {
        "running": num_running,
        "steps": steps,
        "gc_freeze": gc_freeze,
        "median_us": us(totals),
        "min_us": 1e6 * min(totals),
        "p90_us": 1e6 * sorted(totals)[int(0.9 * len(totals))],
        "mean_us": 1e6 * statistics.fmean(totals),
        "per_request_us": us(totals) / num_running,
        "phases_median_us": {k: us(v) for k, v in phases.items()},
    }
    result["phases_median_us"]["outputs + stats"] = us(rest)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--running", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-gc-freeze-rows", action="store_true", help="skip the extra rows measured after gc.freeze()")
    p.add_argument("--baseline", type=Path, help="host_overhead.json of an earlier run: adds a before/after table")
    p.add_argument("--baseline-label", default=None, help="what the baseline is (default: its recorded git commit)")
    p.add_argument("--ab", metavar="REV", help="A-B-A against a git revision, interleaved (benchmarks.host_ab)")
    p.add_argument("--rounds", type=int, default=5, help="--ab: B runs, each between two A runs")
    a = p.parse_args()
    if a.ab:
        from benchmarks.host_ab import ab

        text, data = ab(a.ab, a.rounds, a.running, a.steps)
        print("\n" + text)
        a.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(a.out / "host_ab.md", text)
        write_json(a.out / "host_ab.json", data)
        print(f"wrote {a.out / 'host_ab.md'}")
        return
    env = environment()
    load_before = load_average()
    rows, results = [], []
    for n, freeze in [(n, False) for n in a.running] + ([] if a.no_gc_freeze_rows else [(256, True)]):
        r = measure(n, a.steps, freeze)
        results.append(r)
        ph = r["phases_median_us"]
        rows.append(
            [
                f"{n}" + (" (gc.freeze)" if freeze else ""),
                r["median_us"],
                r["min_us"],
                r["p90_us"],
                r["per_request_us"],
                ph["schedule"],
                ph["execute (input prep)"],
                ph["update"],
                ph["outputs + stats"],
            ]
        )
        print(
            f"{n:5d} running: {r['median_us']:9.0f} us/step median ({r['per_request_us']:.2f} us/request)", flush=True
        )
    env["load_average_after"] = load_average()
    env["load_average_before"] = load_before
    table = markdown_table(
        [
            "running",
            "step median (us)",
            "step min (us)",
            "step p90 (us)",
            "median per request (us)",
            "schedule",
            "input prep",
            "update",
            "outputs + stats",
        ],
        rows,
    )
    text = (
        f"# Host-side cost per decode step (host executor)\n\n"
        f"Engine step with no model: schedule + KV bookkeeping + input preparation (host half) + output "
        f"handling; N requests decoding one token each; {a.steps} steps, median per phase (us).\n\n"
        f"{table}\n\n"
        + (
            ""
            if a.no_gc_freeze_rows
            else "The (gc.freeze) row moves the objects alive at steady state (KV blocks, requests) out of the "
            "cyclic garbage collector's generations first, as serving engines do after start-up; the engine "
            "does not do this itself.\n\n"
        )
        + f"- machine: {env['cpu']}, {env['cpu_count']} cores; python {env['python']}, torch {env['torch']}, "
        f"numpy {env['numpy']}\n- date: {env['date']}; git {env['git']}\n- command: `{env['command']}`\n"
        f"- load average (1/5/15 min) before: {load_before}; after: {env['load_average_after']} "
        f"(the machine is shared; timings are noisy)\n"
    )
    if a.baseline:
        text += "\n" + comparison(json.loads(a.baseline.read_text()), results, a.baseline, a.baseline_label)
    print("\n" + text)
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out / "host_overhead.md", text)
    write_json(a.out / "host_overhead.json", {"env": env, "results": results})
    print(f"wrote {a.out / 'host_overhead.md'}")


def comparison(baseline: dict, results: list[dict], path: Path, label: str | None) -> str:
    """Markdown: median step and phase times of the baseline run vs this one, for the rows both have."""
    before = {(r["running"], r["gc_freeze"]): r for r in baseline["results"]}
    env = baseline["env"]
    rows = []
    for r in results:
        b = before.get((r["running"], r["gc_freeze"]))
        if b is None:
            continue
        row = [
            f"{r['running']}" + (" (gc.freeze)" if r["gc_freeze"] else ""),
            f"{b['median_us']:,.0f} -> {r['median_us']:,.0f}",
            f"{b['median_us'] / r['median_us']:.1f}x",
        ]
        row += [f"{b['phases_median_us'][k]:,.0f} -> {v:,.0f}" for k, v in r["phases_median_us"].items()]
        rows.append(row)
    phases = list(results[0]["phases_median_us"])
    return (
        f"## Before / after (median us, before -> after)\n\n"
        f"Before: {label or env.get('git')} (`{path.name}`: {env.get('date')}, `{env.get('command')}`, load "
        f"average before {env.get('load_average_before')}, after {env.get('load_average_after')}).\n\n"
        + markdown_table(
            ["running", "step", "speed-up"] + [p.replace("execute (input prep)", "input prep") for p in phases], rows
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
