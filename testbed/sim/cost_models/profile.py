"""Step time fitted to measured steps of this engine (experiments.calibration.calibrate), in the spirit of Vidur's
profiling-based prediction (Agrawal et al., MLSys 2024), but over whole steps of the real engine rather than
per operator, so that host work (scheduling, input preparation, sampling, output handling) is priced too.

    t = c_step + c_seq * seqs + linear(tokens) + c_logit * logits
        + c_pair * prefill query-key pairs + c_ctx * decode KV tokens read

    linear(n) = max(c_weights, c_token * n)          "knee" form
              = c_scale * layers * measured(n)       "curve" form

Knee form: the linear layers cost the slower of reading every weight once and computing the step's rows (a
roofline with rates fitted to this machine); the knee c_weights / c_token is chosen by grid search. Curve form:
the shape of the linear-layer cost in rows is the calibration's own microbenchmark of one layer's projections
(the operator model's `linear` curve, operators.py), read piecewise linearly and scaled by a fitted c_scale
(~1 when whole steps cost what their layers do). The rest is fitted by non-negative least squares on relative
error (iteratively reweighted by the prediction). Calibration fits both forms and keeps the one with the lower
relative squared error on its own steps (`linear_form` in the profile; profiles without it are knee form). A
profile names the device, model, kernel and dtype it was measured for, and refuses to price anything else.

Why the curve form: on the 2-core VM of 2026-12-03 one layer's projections cost 2.2-2.6 ms per row x 30 layers
from 64 to 512 rows (flat: the knee form's single slope fits, and wins on each of that day's calibrations); on the
VM of 2026-12-04 they cost 0.81 ms per row at 64 rows and 1.8 at 256-512, a bend no single slope follows: the knee
fit (calibration median |error| 5.8%) priced that day's real prefill and mixed steps 15-17% fast, the curve fit
(3.5%) within 2% (results/fidelity/v11_synth_knee_2026-12-04). Where it deviates from Vidur: one measured curve for
all linear layers, scaled as a whole by the whole-step fit, instead of per-operator predictions summed.

Tried and dropped: a fixed and a per-chunk term for steps with prompt work (kernel=cpu runs a pure decode
step in one C++ call, other steps layer by layer). Fitted on this CPU (2026-12-01) it moved Azure's median
TTFT error from -33% to -12% but made the other held-out workloads worse (mean |error| over
results/fidelity's 25 figures 13.4% against 9.6% without it), so the model stays as above.

Tried and dropped too (results/fidelity/v8_2026-12-03/why_v8.py): a price per token that changes with the step's
size. A lone prefill costs less per token at 64-128 tokens (2.4-2.6 ms on the 2-core CPU) than at 160-512 (2.8-3.2)
or per decode row, so the profile over-prices it there by 16-26%. A second token slope above a break (64-256
tokens, on all or on prefill tokens) fits to zero on two calibrations; a slope per token segment (each >= 0) moves
the error between sizes instead of removing it (fitted on v7's calibration, v7's real synthetic prefill steps' median
residual +1.2% -> +7.6%).
"""

import json
from pathlib import Path

import numpy as np

from testbed.sim.cost_models.base import CostContext, CostModel
from testbed.sim.cost_models.curves import interpolate
from testbed.sim.shape import StepShape

FEATURES = ("step", "seqs", "linear", "logits", "prefill_pairs", "decode_context")
FORMAT = 1
LINEAR_FORMS = ("knee", "curve")


def feature_rows(shapes: list[StepShape], knee: float) -> np.ndarray:
    return np.array(
        [[1.0, s.num_seqs, max(knee, s.num_tokens), s.num_logits, s.prefill_pairs, s.decode_context] for s in shapes],
        dtype=np.float64,
    )


def curve_feature_rows(shapes: list[StepShape], linear_curve: dict) -> np.ndarray:
    """The curve form's features: the linear column is the measured layer curve at the step's rows x layers."""
    layers = float(linear_curve["layers"])
    return np.array(
        [
            [1.0, s.num_seqs, layers * interpolate(linear_curve, s.num_tokens), s.num_logits, s.prefill_pairs]
            + [s.decode_context]
            for s in shapes
        ],
        dtype=np.float64,
    )


def _nnls_relative(x: np.ndarray, t: np.ndarray, rounds: int = 6) -> np.ndarray:
    """Non-negative coefficients minimising sum(((x @ c - t) / (x @ c))^2): relative error measured against
    the prediction, by iteratively reweighted NNLS. Dividing by the measured time instead would pull the
    fit under every noisy (slow) step; this weighting is unbiased for multiplicative noise."""
    from scipy.optimize import nnls

    scale = t
    for _ in range(rounds):
        coef, _ = nnls(x / scale[:, None], t / scale)
        pred = x @ coef
        scale = np.maximum(pred, 1e-3 * t.mean())
    return coef


def _squared_relative(pred: np.ndarray, t: np.ndarray) -> float:
    return float(np.sum(((pred - t) / np.maximum(pred, 1e-12)) ** 2))


def _fit_knee(shapes: list[StepShape], t: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(relative squared error, knee, coefficients) of the knee form, the knee by grid search."""
    tokens = np.array([s.num_tokens for s in shapes], dtype=np.float64)
    best = None
    for knee in np.unique(np.concatenate([[1.0], np.quantile(tokens, np.linspace(0, 0.95, 40))])):
        x = feature_rows(shapes, knee)
        coef = _nnls_relative(x, t)
        err = _squared_relative(x @ coef, t)
        if best is None or err < best[0]:
            best = (err, float(knee), coef)
    if best is None:  # the knee candidates always include 1.0
        raise ValueError("no knee candidate to fit")
    return best


def fit(
    shapes: list[StepShape], seconds: list[float], linear_curve: dict | None = None, linear_form: str = "auto"
) -> dict:
    """Coefficients (seconds per unit of each feature; the curve form's `linear` is a scale on the measured
    curve) minimising relative squared error. linear_curve: {"layers", "x", "seconds"}, one layer's measured
    linear-layer seconds at x rows; with it both forms are fitted and linear_form "auto" keeps the one with the
    lower error, "knee" / "curve" the one named."""
    if linear_form not in ("auto", *LINEAR_FORMS):
        raise ValueError(f"linear_form must be auto, knee or curve, got {linear_form!r}")
    if linear_form == "curve" and linear_curve is None:
        raise ValueError("linear_form='curve' needs the calibration's linear-layer curve (operators were not measured)")
    t = np.asarray(seconds, dtype=np.float64)
    candidates: dict[str, tuple[float, float | None, np.ndarray, np.ndarray]] = {}
    if linear_form in ("auto", "knee"):
        err, best_knee, coef = _fit_knee(shapes, t)
        candidates["knee"] = (err, best_knee, coef, feature_rows(shapes, best_knee) @ coef)
    if linear_curve is not None and linear_form in ("auto", "curve"):
        x = curve_feature_rows(shapes, linear_curve)
        coef = _nnls_relative(x, t)
        candidates["curve"] = (_squared_relative(x @ coef, t), None, coef, x @ coef)
    form = min(candidates, key=lambda name: candidates[name][0])
    _, knee, coef, pred = candidates[form]
    rel = np.abs(pred - t) / t
    result = {
        "linear_form": form,
        "knee_tokens": knee,
        "coefficients": dict(zip(FEATURES, map(float, coef))),
        "fit": {
            "samples": len(t),
            "median_abs_rel_err": float(np.median(rel)),
            "p90_abs_rel_err": float(np.quantile(rel, 0.9)),
            "max_abs_rel_err": float(rel.max()),
            "r2": float(1 - np.sum((pred - t) ** 2) / np.sum((t - t.mean()) ** 2)),
            "forms_median_abs_rel_err": {
                name: float(np.median(np.abs(c[3] - t) / t)) for name, c in candidates.items()
            },
        },
    }
    if form == "curve" and linear_curve is not None:
        result["linear_curve"] = {
            "layers": int(linear_curve["layers"]),
            "x": [float(v) for v in linear_curve["x"]],
            "seconds": [float(v) for v in linear_curve["seconds"]],
        }
    return result


class ProfileCost(CostModel):
    name = "profile"
    tensor_parallel: str | None = "scaled"

    @classmethod
    def resolve(cls, sim, dtype, kernel):
        """The profile's dtype and kernel unless set (kernel=auto resolves to the profile's)."""
        path = Path(sim.profile)
        if not path.exists():
            raise ValueError(f"no profile at {path} (make one with `python -m experiments.calibration.calibrate`)")
        profile = json.loads(path.read_text())
        return dtype or profile.get("dtype", "float32"), profile.get("kernel", kernel) if kernel == "auto" else kernel

    @classmethod
    def build(cls, ctx: CostContext) -> "ProfileCost":  # type: ignore[override]
        return cls(
            ctx.profile,  # type: ignore[arg-type]
            ctx.model,
            ctx.kernel,
            str(ctx.dtype).removeprefix("torch."),
            ctx.max_num_seqs,
            ctx.max_num_batched_tokens,
            ctx.allow_extrapolation,
        )

    def __init__(
        self,
        path: str | Path,
        model: str,
        kernel: str,
        dtype: str,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        allow_extrapolation: bool = False,
    ):
        """max_num_seqs / max_num_batched_tokens: the run's limits, refused (unless allow_extrapolation)
        when they exceed the batches the profile was measured on: a fit says nothing beyond its data."""
        self.path = Path(path)
        if not self.path.exists():
            raise ValueError(f"no profile at {self.path} (make one with `python -m experiments.calibration.calibrate`)")
        try:
            self.profile = json.loads(self.path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.path}: not a profile (invalid JSON: {e})") from None
        p = self.profile
        if p.get("format") != FORMAT or "coefficients" not in p:
            raise ValueError(f"{self.path}: not a testbed step-time profile of format {FORMAT}")
        wanted = {"model": model, "kernel": kernel, "dtype": dtype}
        wrong = {k: (p.get(k), v) for k, v in wanted.items() if p.get(k) != v}
        if wrong:
            what = ", ".join(f"{k} {rec!r} (this run: {run!r})" for k, (rec, run) in wrong.items())
            raise ValueError(f"profile {self.path} was measured for another setup: {what}")
        seen = p.get("calibrated_range") or {}
        beyond = [
            f"{name}={limit} (calibrated up to {seen[key]})"
            for name, limit, key in (
                ("max_num_seqs", max_num_seqs, "max_seqs"),
                ("max_num_batched_tokens", max_num_batched_tokens, "max_tokens"),
            )
            if limit is not None and key in seen and limit > seen[key]
        ]
        if beyond and not allow_extrapolation:
            raise ValueError(
                f"profile {self.path} cannot price this run's batches: {', '.join(beyond)}; lower the "
                "limits, calibrate larger batches, or set executor.allow_extrapolation=true"
            )
        self.form = p.get("linear_form", "knee")  # profiles written before the curve form are knee form
        if self.form not in LINEAR_FORMS:
            raise ValueError(f"{self.path}: linear_form {self.form!r} is not one of {LINEAR_FORMS}")
        if self.form == "curve" and "linear_curve" not in p:
            raise ValueError(f"{self.path}: linear_form 'curve' without its linear_curve")
        self.knee = float(p["knee_tokens"]) if self.form == "knee" else 0.0
        self.curve = p.get("linear_curve") if self.form == "curve" else None
        self.coef = np.array([p["coefficients"][f] for f in FEATURES], dtype=np.float64)

    @property
    def identity(self) -> dict:
        p = self.profile
        return {
            "cost_model": self.name,
            "profile": str(self.path),
            "device": p.get("device"),
            "profile_date": p.get("date"),
            "profile_fit": p.get("fit"),
            "profile_linear_form": self.form,
        }

    def linear_units(self, num_tokens: int) -> float:
        """What the `linear` coefficient multiplies: rows above the knee, or the measured curve x layers."""
        if self.curve is None:
            return max(self.knee, num_tokens)
        return self.curve["layers"] * interpolate(self.curve, num_tokens)

    def step_time(self, s: StepShape) -> float:
        c = self.coef
        return float(
            c[0]
            + c[1] * s.num_seqs
            + c[2] * self.linear_units(s.num_tokens)
            + c[3] * s.num_logits
            + c[4] * s.prefill_pairs
            + c[5] * s.decode_context
        )
