"""Measure this engine's step times and fit the simulator's profile cost model (testbed/sim/cost_models/profile.py).

    python -m experiments.calibration.calibrate model=smollm2-135m kernel=cpu  # -> results/profiles/<name>.json
    python -m experiments.calibration.calibrate model=tiny kernel=torch --quick --out /tmp/profiles

Arguments other than the flags below are Hydra overrides of conf/config.yaml, so the profile is measured
on exactly the engine a run with the same overrides builds. The calibration workloads are synthetic and
kept apart from the held-out workloads of experiments/studies/fidelity.py (Azure, Mooncake, a synthetic
rate sweep): prefill chunks of several sizes and contexts, lone prefills (one request at a time, prompts of
16..768 tokens, three of each: the step a request's TTFT is at concurrency 1), decode batches of 1..64 requests at
short and medium contexts and of 1..16 at long ones, and a mixed offline batch. Each step's shape (testbed.sim.shape)
is taken before it runs; its time is the period from its start to the next step's start, which is what a
request waiting on the engine experiences (schedule, forward, sampling, output handling and the driver's own
work). Steps are driven back to back, so there is no idle time in a period.

The calibration checks itself (experiments/calibration/probe.py): a fixed probe is timed at the start, middle and end,
and the profile is refused (nothing written; `--force` writes it anyway, marked so) when the whole-step
fit's median |error| exceeds 10% or the probe drifted more than 10%. The profile records both.

The whole-step fit's linear-layer term takes one of two forms (testbed/sim/cost_models/profile.py): a knee and one
slope, or the curve the operator microbenchmarks below measured for one layer's projections, scaled; `--linear-form
auto` (the default) keeps whichever fits the calibration's own steps better.

It also times the model's operators one by one (experiments/calibration/operator_bench.py) for the operator-level cost
model (testbed/sim/cost_models/operators.py, `executor.cost_model=operators`); `--no-operators` skips that.
"""

import argparse
import random
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

from experiments.calibration.probe import MAX_DRIFT, MAX_FIT_ERROR, SelfCheck, probe_seconds
from experiments.calibration.step_shapes import measure
from experiments.results.environment import cpu_name, environment
from experiments.results.files import write_json
from testbed.sim.cost_models.profile import FEATURES, FORMAT, LINEAR_FORMS, fit
from testbed.sim.shape import StepShape

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "results" / "profiles"


class Workload(NamedTuple):
    name: str
    lengths: list[tuple[int, int]]  # (prompt length, output length) per request
    sequential: bool = False  # submit each request once the one before it finished (else all at once)


# prompt lengths of the lone prefills: the shapes of the held-out workloads' prompts, where the time per
# token of a lone prefill is not linear (results/fidelity/README.md, v7)
LONE_PROMPTS = (16, 32, 64, 96, 128, 160, 192, 256, 384, 768)
LONE_PROMPTS_QUICK = (16, 64, 200)


def workloads(max_len: int, quick: bool) -> list[Workload]:
    """The calibration workloads, sized to the model's context."""
    rng = random.Random(0)
    fit_len = lambda p, o: (min(p, max_len - o - 1), o)
    batches = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32, 64]
    contexts = [48, 320] if quick else [48, 320, 1000]
    prefill = [fit_len(p, 1) for p in ([32, 200, 700] if quick else [32, 128, 512, 1500]) for _ in range(3)]
    out = [Workload("prefill", prefill)]
    # one prefill step per request, alone; each round shuffled (its own generator: the mixed batch stays
    # the same) so no length always follows another; the workload's last step is not timed (no next start)
    grid, shuffle = (LONE_PROMPTS_QUICK if quick else LONE_PROMPTS), random.Random(1)
    lone = [p for _ in range(2 if quick else 3) for p in shuffle.sample(grid, k=len(grid))]
    out.append(Workload("lone prefills", [fit_len(p, 1) for p in lone], sequential=True))
    for ctx in contexts:
        for b in batches:
            if ctx >= 1000 and b > 16:
                continue  # its pure-decode tail is the same ~7 sequences as b=16: only more 512-token chunks
            out.append(Workload(f"decode b={b} ctx={ctx}", [fit_len(ctx, 12 if quick else 24) for _ in range(b)]))
    n = 12 if quick else 48
    out.append(Workload("mixed", [fit_len(rng.randint(16, 500), rng.randint(8, 96)) for _ in range(n)]))
    return out


def profile_name(engine, dtype: str) -> str:
    """<device>-<model>-<kernel>-<dtype>: the CPU's name, or the GPU's when the engine runs on one."""
    if engine.device.type == "cuda":
        import torch

        device = "gpu-" + torch.cuda.get_device_name(engine.device)
    else:
        device = "cpu-" + cpu_name()
    device = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"{device}-{engine.model_name}-{engine.kernel}-{dtype}"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=PROFILES, help="folder for the profile JSON")
    p.add_argument("--quick", action="store_true", help="fewer, shorter workloads (tests)")
    p.add_argument("--warmup", type=int, default=2, help="runs of a throwaway workload first (kernel builds)")
    p.add_argument("--force", action="store_true", help="write the profile even if its self-check fails")
    p.add_argument("--max-fit-error", type=float, default=MAX_FIT_ERROR, help="refuse above this median |error|")
    p.add_argument("--max-drift", type=float, default=MAX_DRIFT, help="refuse when the probe moved more")
    p.add_argument("--probe-repeats", type=int, default=3, help="probe runs per timing (their median)")
    p.add_argument("--no-operators", action="store_true", help="skip the operator microbenchmarks")
    p.add_argument(
        "--linear-form",
        choices=("auto", *LINEAR_FORMS),
        default="auto",
        help="the profile's linear-layer term (testbed/sim/cost_models/profile.py); auto: the better fit of both",
    )
    return p.parse_known_args(argv)


def build(overrides: list[str]):
    from hydra import compose, initialize_config_module

    from experiments.run.runner import build_engine

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=["progress=false", *overrides])
    engine = build_engine(cfg, record_clock=False)
    if engine.config.executor.name != "real":
        raise SystemExit("calibration measures the real engine: drop executor=...")
    return engine


def main(argv=None) -> Path | None:
    """The profile's path, or None when the self-check refused it (exit status 2 from the command line)."""
    args, overrides = parse_args(argv)
    engine = build(overrides)
    measure(engine, [(64, 4)] * max(1, args.warmup), seed=999)  # builds kernels, warms caches
    started = time.perf_counter()

    def log(msg: str) -> None:
        print(f"{msg} ({time.perf_counter() - started:.0f} s so far)", file=sys.stderr)

    probes = [probe_seconds(engine, args.probe_repeats)]
    log(f"probe (start): {1e3 * probes[0]:.1f} ms")
    shapes, seconds, names = [], [], []
    plan = workloads(engine.max_model_len, args.quick)
    for i, (name, lengths, sequential) in enumerate(plan):
        s, t = measure(engine, lengths, seed=i, sequential=sequential)
        shapes += s
        seconds += t
        names += [name] * len(t)
        median = f", median {1e3 * sorted(t)[len(t) // 2]:.1f} ms" if t else ""
        log(f"[{i + 1}/{len(plan)}] {name}: {len(t)} steps{median}")
        if i == len(plan) // 2 - 1:
            probes.append(probe_seconds(engine, args.probe_repeats))
            log(f"probe (middle): {1e3 * probes[-1]:.1f} ms")
    operators = None
    if not args.no_operators:
        from experiments.calibration.operator_bench import operator_samples
        from testbed.sim.cost_models.operators import fit_operators

        operators = fit_operators(operator_samples(engine, args.quick), shapes, seconds)
        log(f"operators: host work residual median |error| {100 * operators['fit']['median_abs_rel_err']:.1f}%")
    probes.append(probe_seconds(engine, args.probe_repeats))
    log(f"probe (end): {1e3 * probes[-1]:.1f} ms")
    result = fit(shapes, seconds, linear_curve(operators), args.linear_form)
    check = SelfCheck.of(result["fit"]["median_abs_rel_err"], probes, args.max_fit_error, args.max_drift)
    profile = describe(engine, overrides, shapes, seconds, names, result, check, args.force, operators)
    path = args.out / f"{profile_name(engine, profile['dtype'])}.json"
    f = result["fit"]
    print(
        f"fit: {f['samples']} steps, median |error| {100 * f['median_abs_rel_err']:.1f}%, "
        f"p90 {100 * f['p90_abs_rel_err']:.1f}%, R^2 {f['r2']:.3f}; probe drift {100 * check.drift:.1f}%; "
        f"linear form {result['linear_form']} (median |error| "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in f["forms_median_abs_rel_err"].items())
        + "); coefficients "
        + ", ".join(f"{k}={v:.3g}" for k, v in zip(FEATURES, result["coefficients"].values())),
        file=sys.stderr,
    )
    if not check.passed and not args.force:
        print(f"REFUSED, {path} not written: " + "; ".join(check.failures) + " (--force writes it)", file=sys.stderr)
        return None
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(path, profile)
    print(f"{path}" + ("" if check.passed else " (FORCED past: " + "; ".join(check.failures) + ")"), file=sys.stderr)
    return path


def linear_curve(operators: dict | None) -> dict | None:
    """The operator benchmark's linear-layer curve with its layer count: the profile's curve form's shape."""
    if not operators or "linear" not in operators:
        return None
    return {"layers": operators["layers"], **operators["linear"]}


def describe(engine, overrides, shapes, seconds, names, result, check, forced, operators) -> dict:
    dtype = str(engine.dtype).removeprefix("torch.")
    env = environment()
    return {
        "format": FORMAT,
        "kind": "testbed step-time profile",
        "device": f"cpu: {env['cpu']}" if engine.device.type == "cpu" else env["device"],
        "model": engine.model_name,
        "kernel": engine.kernel,
        "dtype": dtype,
        "block_size": engine.config.cache.block_size,
        "max_num_batched_tokens": engine.config.scheduler.max_num_batched_tokens,
        "environment": env,
        "overrides": overrides,
        "calibrated_range": {
            "max_seqs": max(s.num_seqs for s in shapes),
            "max_tokens": max(s.num_tokens for s in shapes),
        },
        **result,
        "self_check": check.as_dict(forced),
        "operators": operators,
        "samples": {
            "features": list(StepShape.__dataclass_fields__),
            "workload": names,
            "shapes": [[getattr(s, f) for f in StepShape.__dataclass_fields__] for s in shapes],
            "seconds": seconds,
        },
    }


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 2)
