"""Async scheduling on the CPU: the step period with the host's work overlapped with the device's.

    python -m benchmarks.async_scheduling     # 256 running; writes results/host_overhead/async_scheduling.*
    python -m benchmarks.async_scheduling --running 64 256 --steps 100

The device is the host executor holding each step for a fixed time (sleeping, so the host is free, as it
is while a GPU computes); the host's work is the engine's real per-step work at N running decode requests
(schedule, block tables, staged inputs, update, outputs). First the host cost H alone (device time 0,
synchronous: the step period less its device half), then for device times of 0.5 H, H and 2 H (D: the
time the device half really took, a sleep being inexact) the median step period synchronous (expected
H + D) and with async scheduling (expected max(H, D)), interleaved, repeated.
"""

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.common import environment, markdown_table, write_json
from benchmarks.host import make_steady_engine
from experiments.results.atomic import atomic_write_text

RESULTS = Path(__file__).resolve().parents[1] / "results" / "host_overhead"


def median_period(engine, steps: int) -> tuple[float, float]:
    """Median seconds per step over `steps` steps (the engine in its steady decode state), and the median
    time the executor's device half (run) took: a sleep is never exactly what it was asked for."""
    periods, runs = [], []
    run = engine.executor.run

    def timed_run(*a):
        start = time.perf_counter()
        result = run(*a)
        runs.append(time.perf_counter() - start)
        return result

    engine.executor.run = timed_run
    last = time.perf_counter()
    for _ in range(steps):
        engine.step()
        now = time.perf_counter()
        periods.append(now - last)
        last = now
    return statistics.median(periods), statistics.median(runs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    rows, raw = [], []
    for running in args.running:
        base = [median_period(make_steady_engine(running), args.steps) for _ in range(args.repeats)]
        host = statistics.median(period - run for period, run in base)  # the step without its device half
        for factor in (0.5, 1.0, 2.0):
            sync, asynchronous, devices = [], [], []
            for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
                for mode, sink in ((False, sync), (True, asynchronous)):
                    engine = make_steady_engine(running, host_step_time_s=factor * host, async_scheduling=mode)
                    period, device = median_period(engine, args.steps)
                    sink.append(period)
                    devices.append(device)
            s, a, device = statistics.median(sync), statistics.median(asynchronous), statistics.median(devices)
            ms = [1e3 * x for x in (host, factor * host, device, s, host + device, a, max(host, device))]
            rows.append([running, *ms, s / a])
            raw.append(
                {
                    "running": running,
                    "host_s": host,
                    "device_asked_s": factor * host,
                    "device_s": devices,
                    "sync_s": sync,
                    "async_s": asynchronous,
                }
            )
    headers = [
        "running",
        "host H (ms)",
        "device asked",
        "device D (ms)",
        "sync (ms)",
        "H + D",
        "async (ms)",
        "max(H, D)",
        "sync / async",
    ]
    table = markdown_table(headers, rows)
    env = environment()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out / "async_scheduling.json",
        {"rows": raw, "environment": env, "steps": args.steps, "repeats": args.repeats},
    )
    atomic_write_text(
        args.out / "async_scheduling.md",
        "# Async scheduling: step period with the host overlapped (CPU, host executor holding the device)\n\n"
        f"{table}\n\nMedian step period over {args.steps} steps, median of {args.repeats} interleaved repeats. "
        f"Machine: {env['cpu']}, {env['cpu_count']} cores, load {env['load_average']}, torch {env['torch']}, "
        f"{env['date']}, git {env['git']}. Command: `{env['command']}`.\n",
    )
    print(table)


if __name__ == "__main__":
    main()
