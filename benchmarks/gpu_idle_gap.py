"""How much of a step the GPU sits idle: steady decode on CUDA, synchronous vs async scheduling, from a
torch profiler trace of the device's kernels.

    python -m benchmarks.gpu_idle_gap                         # llama-3.2-1b shape, 256 running, triton
    python -m benchmarks.gpu_idle_gap --model tiny --running 64 --out /tmp/gap

Idle fraction = 1 - (time covered by at least one GPU kernel) / (span from the first kernel to the last)
over the profiled steps. The target (issue 15) is < 10% with async scheduling at batch 256.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

from experiments.results.atomic import atomic_write_text

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu_check"


def busy_fraction(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(union of the intervals' lengths, span from the first start to the last end): what the device was
    busy for, and the window it could have been."""
    if not intervals:
        return 0.0, 0.0
    intervals = sorted(intervals)
    busy, (cur_start, cur_end) = 0.0, intervals[0]
    for start, end in intervals[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy, intervals[-1][1] - intervals[0][0]


def measure(model: str, running: int, steps: int, async_scheduling: bool, kernel: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from testbed import Engine, EngineConfig, SamplingParams

    rng = random.Random(0)
    engine = Engine(
        EngineConfig(
            model=model,
            kernel=kernel,
            max_num_seqs=running,
            max_num_batched_tokens=8192,
            max_model_len=4096,
            async_scheduling=async_scheduling,
        )
    )
    params = SamplingParams(max_tokens=steps + 64, ignore_eos=True)
    for i in range(running):
        engine.add_request(str(i), [rng.randrange(1000, 20000) for _ in range(rng.randint(100, 1024))], params)
    while engine.scheduler.waiting or any(r.num_output_tokens == 0 for r in engine.scheduler.running):
        engine.step()
    for _ in range(10):  # steady decode, graphs warm
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA"]
    busy, span = busy_fraction(kernels)
    return {
        "async_scheduling": async_scheduling,
        "running": running,
        "steps": steps,
        "wall_s": wall,
        "step_ms": 1e3 * wall / steps,
        "gpu_busy_us": busy,
        "span_us": span,
        "idle_fraction": 1 - busy / span if span else None,
        "kernels": len(kernels),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--kernel", default="auto")
    p.add_argument("--running", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_idle_gap: no CUDA device here; nothing to measure", file=sys.stderr)
        return
    rows = [measure(args.model, args.running, args.steps, mode, args.kernel) for mode in (False, True)]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        args.out / "idle_gap.json", json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1)
    )
    for r in rows:
        print(
            f"async={r['async_scheduling']}: {r['step_ms']:.2f} ms/step, GPU idle {100 * r['idle_fraction']:.1f}% "
            f"of the span ({r['kernels']} kernels)"
        )


if __name__ == "__main__":
    main()
