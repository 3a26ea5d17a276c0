"""Step time fitted to measured steps of this engine (experiments.calibration.calibrate), in the spirit of Vidur's
profiling-based prediction (Agrawal et al., MLSys 2024), but over whole steps of the real engine rather than
per operator, so that host work (scheduling, input preparation, sampling, output handling) is priced too.

    t = c_step + c_seq * seqs + max(c_weights, c_token * tokens) + c_logit * logits
        + c_pair * prefill query-key pairs + c_ctx * decode KV tokens read

The linear layers cost the slower of reading every weight once and computing the step's rows (a roofline
with rates fitted to this machine); the knee c_weights / c_token is chosen by grid search, the rest by
non-negative least squares on relative error (iteratively reweighted by the prediction). A profile names
the device, model, kernel and dtype it was measured for, and refuses to price anything else.

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
from testbed.sim.shape import StepShape

FEATURES = ("step", "seqs", "linear", "logits", "prefill_pairs", "decode_context")
FORMAT = 1


def feature_rows(shapes: list[StepShape], knee: float) -> np.ndarray:
    return np.array(
        [[1.0, s.num_seqs, max(knee, s.num_tokens), s.num_logits, s.prefill_pairs, s.decode_context] for s in shapes],
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


def fit(shapes: list[StepShape], seconds: list[float]) -> dict:
    """Coefficients (seconds per unit of each feature) and the knee, minimising relative squared error."""
    t = np.asarray(seconds, dtype=np.float64)
    tokens = np.array([s.num_tokens for s in shapes], dtype=np.float64)
    best = None
    for knee in np.unique(np.concatenate([[1.0], np.quantile(tokens, np.linspace(0, 0.95, 40))])):
        x = feature_rows(shapes, knee)
        coef = _nnls_relative(x, t)
        pred = x @ coef
        err = float(np.sum(((pred - t) / np.maximum(pred, 1e-12)) ** 2))
        if best is None or err < best[0]:
            best = (err, knee, coef)
    if best is None:  # the knee candidates always include 1.0
        raise ValueError("no knee candidate to fit")
    _, knee, coef = best
    pred = feature_rows(shapes, knee) @ coef
    rel = np.abs(pred - t) / t
    return {
        "knee_tokens": float(knee),
        "coefficients": dict(zip(FEATURES, map(float, coef))),
        "fit": {
            "samples": len(t),
            "median_abs_rel_err": float(np.median(rel)),
            "p90_abs_rel_err": float(np.quantile(rel, 0.9)),
            "max_abs_rel_err": float(rel.max()),
            "r2": float(1 - np.sum((pred - t) ** 2) / np.sum((t - t.mean()) ** 2)),
        },
    }


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
        self.knee = float(p["knee_tokens"])
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
        }

    def step_time(self, s: StepShape) -> float:
        c = self.coef
        return float(
            c[0]
            + c[1] * s.num_seqs
            + c[2] * max(self.knee, s.num_tokens)
            + c[3] * s.num_logits
            + c[4] * s.prefill_pairs
            + c[5] * s.decode_context
        )
