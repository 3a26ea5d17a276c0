"""experiments.calibration.refit: a profile's whole-step model fitted again from its own recorded steps."""

import json
import random

import pytest

from experiments.calibration.refit import main, refit
from testbed.sim.cost_models.curves import interpolate
from testbed.sim.cost_models.profile import FORMAT, ProfileCost, fit
from testbed.sim.shape import StepShape

from .test_cost_models import BENT_CURVE, synthetic_shapes


def recorded_profile() -> dict:
    """A knee-form profile (as calibrations before the curve form wrote) of steps that follow BENT_CURVE."""
    shapes, rng = synthetic_shapes(300), random.Random(3)
    seconds = [
        (2e-3 + 30 * interpolate(BENT_CURVE, s.num_tokens) + 3e-9 * s.prefill_pairs + 4e-8 * s.decode_context)
        * rng.uniform(0.98, 1.02)
        for s in shapes
    ]
    result = fit(shapes, seconds)
    result.pop("linear_form")
    return {
        "format": FORMAT,
        "model": "m",
        "kernel": "k",
        "dtype": "float32",
        **result,
        "self_check": {"probe_seconds": [1.0, 1.02, 1.01], "max_fit_error": 0.1, "max_drift": 0.1},
        "operators": {"layers": BENT_CURVE["layers"], "linear": {k: BENT_CURVE[k] for k in ("x", "seconds")}},
        "samples": {
            "features": list(StepShape.__dataclass_fields__),
            "shapes": [[getattr(s, f) for f in StepShape.__dataclass_fields__] for s in shapes],
            "seconds": seconds,
        },
    }


def test_refit_takes_the_curve_form_from_the_same_steps_and_keeps_the_measurements(tmp_path):
    old = recorded_profile()
    new = refit(old)
    assert new["linear_form"] == "curve" and new["coefficients"]["linear"] == pytest.approx(1.0, rel=0.03)
    assert new["fit"]["median_abs_rel_err"] < 0.02 < old["fit"]["median_abs_rel_err"]
    assert new["samples"] == old["samples"] and new["operators"] == old["operators"]
    assert new["self_check"]["passed"] and new["self_check"]["probe_seconds"] == [1.0, 1.02, 1.01]
    assert new["refitted"]["from_fit"] == old["fit"]
    knee = refit(old, "knee")
    assert knee["linear_form"] == "knee" and knee["coefficients"] == pytest.approx(old["coefficients"])

    src, out = tmp_path / "old.json", tmp_path / "new.json"
    src.write_text(json.dumps(old))
    assert main([str(src), "--out", str(out)]) == 0
    cost = ProfileCost(out, "m", "k", "float32")
    assert cost.form == "curve" and ProfileCost(src, "m", "k", "float32").form == "knee"  # old profiles: knee form


def test_refit_refuses_what_it_cannot_refit(tmp_path):
    src = tmp_path / "old.json"
    src.write_text(json.dumps({"format": FORMAT, "coefficients": {}}))  # no samples
    assert main([str(src), "--out", str(tmp_path / "new.json")]) == 2
    assert not (tmp_path / "new.json").exists()
    with pytest.raises(SystemExit):
        main([str(src), "--out", str(src)])
    drifted = recorded_profile()
    drifted["self_check"]["probe_seconds"] = [1.0, 1.3, 1.0]
    src.write_text(json.dumps(drifted))
    assert main([str(src), "--out", str(tmp_path / "new.json")]) == 2  # refused like the calibration would be
    assert main([str(src), "--out", str(tmp_path / "new.json"), "--force"]) == 0
    assert json.loads((tmp_path / "new.json").read_text())["self_check"]["forced"]
