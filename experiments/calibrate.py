"""Measure this engine's step times and fit the simulator's profile cost model (testbed/sim/cost_models/profile.py).

    python -m experiments.calibrate model=smollm2-135m kernel=cpu            # -> results/profiles/<name>.json
    python -m experiments.calibrate model=tiny kernel=torch --quick --out /tmp/profiles

Arguments other than the flags below are Hydra overrides of conf/config.yaml, so the profile is measured
on exactly the engine a run with the same overrides builds. The calibration workloads are synthetic and
kept apart from the held-out workloads of experiments/studies/fidelity.py (Azure, Mooncake, a synthetic
rate sweep): prefill chunks of several sizes and contexts, decode batches of 1..64 requests at short and
long contexts, and a mixed offline batch. Each step's shape (testbed.sim.shape) is taken before it runs;
its time is the period from its start to the next step's start, which is what a request waiting on the
engine experiences (schedule, forward, sampling, output handling and the driver's own work). Steps are
driven back to back, so there is no idle time in a period.
"""

import argparse
import random
import re
import sys
import time
from pathlib import Path

from benchmarks.common import cpu_name, environment
from experiments.results import write_json
from testbed import SamplingParams
from testbed.sim.cost_models.profile import FEATURES, FORMAT, fit
from testbed.sim.shape import StepShape

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "results" / "profiles"


class StepShapes:
    """While active (a context manager), records each step of an engine: its shape (taken inside execute,
    before the forward) and its start time. Instrumentation for calibration and fidelity measurements,
    not part of a normal run: it wraps the executor's execute and removes the wrapper on exit."""

    def __init__(self, engine):
        self.engine = engine
        self.shapes: list[StepShape] = []
        self.starts: list[float] = []
        self.busy: list[bool] = []  # work was left after the step: the next one followed at once (no idle wait)

    def __enter__(self) -> "StepShapes":
        executor = self.engine.executor
        execute = executor.execute

        def shaped(out):
            self.shapes.append(StepShape.of(out))
            return execute(out)

        executor.execute = shaped
        self.engine.step_callbacks.append(self._on_step)
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.executor.execute  # the instance attribute: the class's method shows again
        self.engine.step_callbacks.remove(self._on_step)

    def _on_step(self, stats) -> None:
        self.starts.append(stats.start_time)
        self.busy.append(stats.num_running + stats.num_waiting > 0)

    def periods(self, end: float | None = None) -> list[float]:
        """Start-to-next-start of each step (the last one ends at `end`, or is dropped)."""
        nxt = self.starts[1:] + ([end] if end is not None else [])
        return [b - a for a, b in zip(self.starts, nxt)]


def workloads(max_len: int, quick: bool) -> list[tuple[str, list[tuple[int, int]]]]:
    """(name, [(prompt length, output length)]) per calibration workload, sized to the model's context."""
    rng = random.Random(0)
    fit_len = lambda p, o: (min(p, max_len - o - 1), o)
    batches = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32, 64]
    contexts = [48, 320] if quick else [48, 320, 1000]
    out = [("prefill", [fit_len(p, 1) for p in ([32, 200, 700] if quick else [32, 128, 512, 1500]) for _ in range(3)])]
    for ctx in contexts:
        for b in batches:
            out.append((f"decode b={b} ctx={ctx}", [fit_len(ctx, 12 if quick else 24) for _ in range(b)]))
    n = 12 if quick else 48
    out.append(("mixed", [fit_len(rng.randint(16, 500), rng.randint(8, 96)) for _ in range(n)]))
    return out


def measure(engine, lengths: list[tuple[int, int]], seed: int) -> tuple[list[StepShape], list[float]]:
    """Run one workload offline, back to back; (shapes, periods) of its steps but the last."""
    rng = random.Random(seed)
    vocab = engine.arch.vocab_size
    with StepShapes(engine) as recorder:
        for i, (prompt, output) in enumerate(lengths):
            ids = [rng.randrange(100, vocab) for _ in range(prompt)]
            params = SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)
            engine.add_request(f"c{seed}-{i}", ids, params)
        while engine.has_unfinished():
            engine.step()
    periods = recorder.periods()
    return recorder.shapes[: len(periods)], periods


def profile_name(model: str, kernel: str, dtype: str) -> str:
    device = re.sub(r"[^a-z0-9]+", "-", cpu_name().lower()).strip("-")
    return f"cpu-{device}-{model}-{kernel}-{dtype}"


def main(argv=None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=PROFILES, help="folder for the profile JSON")
    p.add_argument("--quick", action="store_true", help="fewer, shorter workloads (tests)")
    p.add_argument("--warmup", type=int, default=2, help="steps of a throwaway workload first (kernel builds)")
    args, overrides = p.parse_known_args(argv)
    from hydra import compose, initialize_config_dir

    from experiments.runner import build_engine

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["progress=false", *overrides])
    engine = build_engine(cfg, record_clock=False)
    if engine.config.executor != "real":
        raise SystemExit("calibration measures the real engine: drop executor=...")
    if engine.device.type != "cpu":
        print("note: profiles are named after the CPU; this one is measured on", engine.device, file=sys.stderr)
    measure(engine, [(64, 4)] * max(1, args.warmup), seed=999)  # builds kernels, warms caches
    shapes, seconds, names = [], [], []
    started = time.perf_counter()
    plan = workloads(engine.max_model_len, args.quick)
    for i, (name, lengths) in enumerate(plan):
        s, t = measure(engine, lengths, seed=i)
        shapes += s
        seconds += t
        names += [name] * len(t)
        print(
            f"[{i + 1}/{len(plan)}] {name}: {len(t)} steps, median {1e3 * sorted(t)[len(t) // 2]:.1f} ms "
            f"({time.perf_counter() - started:.0f} s so far)",
            file=sys.stderr,
        )
    result = fit(shapes, seconds)
    dtype = str(engine.dtype).removeprefix("torch.")
    env = environment()
    profile = {
        "format": FORMAT,
        "kind": "testbed step-time profile",
        "device": f"cpu: {env['cpu']}" if engine.device.type == "cpu" else env["device"],
        "model": engine.model_name,
        "kernel": engine.kernel,
        "dtype": dtype,
        "block_size": engine.config.block_size,
        "max_num_batched_tokens": engine.config.max_num_batched_tokens,
        "environment": env,
        "overrides": overrides,
        "calibrated_range": {
            "max_seqs": max(s.num_seqs for s in shapes),
            "max_tokens": max(s.num_tokens for s in shapes),
        },
        **result,
        "samples": {
            "features": list(StepShape.__dataclass_fields__),
            "workload": names,
            "shapes": [[getattr(s, f) for f in StepShape.__dataclass_fields__] for s in shapes],
            "seconds": seconds,
        },
    }
    path = args.out / f"{profile_name(engine.model_name, engine.kernel, dtype)}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(path, profile)
    f = result["fit"]
    print(
        f"{path}: {f['samples']} steps, median |error| {100 * f['median_abs_rel_err']:.1f}%, "
        f"p90 {100 * f['p90_abs_rel_err']:.1f}%, R^2 {f['r2']:.3f}; coefficients "
        + ", ".join(f"{k}={v:.3g}" for k, v in zip(FEATURES, result["coefficients"].values())),
        file=sys.stderr,
    )
    return path


if __name__ == "__main__":
    main()
