"""Fit a profile's whole-step model again from the steps it recorded, without measuring anything: to compare the
linear-layer forms of testbed/sim/cost_models/profile.py on the same calibration, or to bring a profile written
before a form existed up to date.

    python -m experiments.calibration.refit results/profiles/P.json --linear-form curve --out /tmp/P-curve.json

The new profile keeps the old one's measurements (samples, operators, probes) and environment, takes the new fit
and its self-check (the probes' drift as measured, the fit's error as refitted), and records what it was
refitted from. It is refused, like a calibration, when the self-check fails (unless --force).
"""

import argparse
import json
import sys
from pathlib import Path

from experiments.calibration.calibrate import linear_curve
from experiments.calibration.probe import SelfCheck
from experiments.results.environment import environment
from experiments.results.files import write_json
from testbed.sim.cost_models.profile import FORMAT, LINEAR_FORMS, fit
from testbed.sim.shape import StepShape


def refit(profile: dict, linear_form: str = "auto") -> dict:
    """The profile with its whole-step model fitted again from its samples (a new dict)."""
    if profile.get("format") != FORMAT or "samples" not in profile:
        raise ValueError(f"not a testbed step-time profile of format {FORMAT} with its samples")
    samples = profile["samples"]
    fields = list(StepShape.__dataclass_fields__)
    if samples["features"] != fields:
        raise ValueError(f"the profile's step shapes have fields {samples['features']}, this testbed's {fields}")
    shapes = [StepShape(*row) for row in samples["shapes"]]
    result = fit(shapes, samples["seconds"], linear_curve(profile.get("operators")), linear_form)
    old = profile["self_check"]
    check = SelfCheck.of(
        result["fit"]["median_abs_rel_err"], old["probe_seconds"], old["max_fit_error"], old["max_drift"]
    )
    out = {k: v for k, v in profile.items() if k not in ("linear_form", "knee_tokens", "linear_curve")}
    out.update(result)
    out["self_check"] = check.as_dict(forced=False)
    out["refitted"] = {"environment": environment(), "linear_form": linear_form, "from_fit": profile["fit"]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", type=Path)
    p.add_argument("--out", type=Path, required=True, help="the refitted profile's path (never the input's)")
    p.add_argument("--linear-form", choices=("auto", *LINEAR_FORMS), default="auto")
    p.add_argument("--force", action="store_true", help="write it even if its self-check fails")
    args = p.parse_args(argv)
    if args.out.resolve() == args.profile.resolve():
        p.error("--out must differ from the profile: the measured profile is kept as it was")
    try:
        new = refit(json.loads(args.profile.read_text()), args.linear_form)
    except (ValueError, json.JSONDecodeError, KeyError) as e:
        print(f"{args.profile}: {e}", file=sys.stderr)
        return 2
    f, check = new["fit"], new["self_check"]
    print(
        f"refit: linear form {new['linear_form']}, median |error| {100 * f['median_abs_rel_err']:.1f}% "
        f"(was {100 * new['refitted']['from_fit']['median_abs_rel_err']:.1f}%), p90 {100 * f['p90_abs_rel_err']:.1f}%",
        file=sys.stderr,
    )
    if not check["passed"] and not args.force:
        print("REFUSED: " + "; ".join(check["failures"]), file=sys.stderr)
        return 2
    new["self_check"]["forced"] = not check["passed"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, new)
    print(args.out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
