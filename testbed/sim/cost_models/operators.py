"""Step time priced from its operators, each fitted on microbenchmarks of this engine's own kernels, as Vidur
does (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024): a batch
shape never seen whole is still priced by its parts.

    t = L * (linear(tokens) + norm_act(tokens) + prefill_attn + decode_attn) + logits(logit rows) + host

  linear(n)      one layer's qkv, o, gate_up and down projections on n rows    measured grid, interpolated
  norm_act(n)    one layer's two RMSNorms, rotary and SiLU-and-mul on n rows    measured grid, interpolated
  logits(m)      final norm, LM head and greedy pick on m rows                  measured grid, interpolated
  prefill_attn   sum over chunks of a + b * chunk + c * causal query-key pairs (chunk x context)
  decode_attn    a (once, when any row decodes) + b * rows + c * KV tokens read (total context)
  host           h0 + h1 * sequences + h2 * tokens: scheduling, input preparation, sampling bookkeeping,
                 output handling; fitted on the calibration's whole-step periods minus the operators' sum

Where it deviates from Vidur: the 1-D operators are interpolated piecewise-linearly between measured grid
points (extrapolated with the last segment's slope) instead of a random forest; attention is a linear model
in chunk size and query-key pairs (prefill) or rows and KV tokens (decode) rather than a regression over the
raw (batch, length) grid, which is what lets it price a mix of chunks it never measured; one layer is timed
and multiplied by the layer count (no cross-layer cache effects); host work is not profiled per component
(Vidur times the scheduler, prepare and process steps) but fitted as the residual of whole steps, which also
absorbs what the operator sum misses (e.g. kernel=cpu runs a pure decode step's layers in one C++ call).
Tensor parallelism is not priced.

The operators are stored in the profile JSON under "operators" (experiments.calibration.calibrate writes both this and
the whole-step fit of profile.py); `executor.cost_model=operators executor.profile=PATH` selects this model.
"""

import numpy as np

from testbed.sim.cost_models.curves import interpolate
from testbed.sim.cost_models.profile import ProfileCost, _nnls_relative
from testbed.sim.shape import StepShape

CURVES = ("linear", "norm_act", "logits")
PREFILL = ("chunks", "tokens", "pairs")
DECODE = ("step", "rows", "context")
HOST = ("step", "seqs", "tokens")


def prefill_pairs(chunk: float, context_before: float) -> float:
    """Causal query-key pairs of one chunk (as StepShape counts them)."""
    return chunk * (context_before + (chunk + 1) / 2)


def _curve(points) -> dict:
    """Median seconds per distinct x of [(x, seconds)], sorted: the grid interpolate() reads."""
    by_x: dict[float, list[float]] = {}
    for x, t in points:
        by_x.setdefault(float(x), []).append(float(t))
    xs = sorted(by_x)
    return {"x": xs, "seconds": [float(np.median(by_x[x])) for x in xs]}


def prefill_rows(samples) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[1.0, q, prefill_pairs(q, c)] for q, c, _ in samples])
    return x, np.array([t for *_, t in samples])


def decode_rows(samples) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[1.0, b, ctx] for b, ctx, _ in samples])
    return x, np.array([t for *_, t in samples])


class Operators:
    """The fitted operators (a profile's "operators" section) and the step time they price."""

    def __init__(self, section: dict):
        self.layers = int(section["layers"])
        self.curves = {name: section[name] for name in CURVES}
        self.prefill = np.array([section["attn_prefill"][k] for k in PREFILL])
        self.decode = np.array([section["attn_decode"][k] for k in DECODE])
        self.host = np.array([section["host"][k] for k in HOST])

    def device_time(self, s: StepShape) -> float:
        per_layer = interpolate(self.curves["linear"], s.num_tokens) + interpolate(
            self.curves["norm_act"], s.num_tokens
        )
        if s.prefill_seqs:
            per_layer += float(self.prefill @ [s.prefill_seqs, s.prefill_tokens, s.prefill_pairs])
        if s.decode_seqs:
            per_layer += float(self.decode @ [1.0, s.decode_tokens, s.decode_context])
        logits = interpolate(self.curves["logits"], s.num_logits) if s.num_logits else 0.0
        return self.layers * per_layer + logits

    def host_time(self, s: StepShape) -> float:
        return float(self.host @ [1.0, s.num_seqs, s.num_tokens])

    def step_time(self, s: StepShape) -> float:
        return self.device_time(s) + self.host_time(s)


def fit_operators(samples: dict, shapes: list[StepShape], seconds: list[float]) -> dict:
    """The "operators" section of a profile from microbenchmarks (experiments.calibration.operator_bench: per operator a
    list of (x..., seconds), one layer's time for per-layer operators, and "layers") and the calibration's
    whole steps (shapes and measured periods), on which the host term is fitted and the result scored."""
    section: dict = {"layers": int(samples["layers"])}
    for name in CURVES:
        section[name] = _curve(samples[name])
    x, t = prefill_rows(samples["attn_prefill"])
    section["attn_prefill"] = dict(zip(PREFILL, map(float, _nnls_relative(x, t))))
    x, t = decode_rows(samples["attn_decode"])
    section["attn_decode"] = dict(zip(DECODE, map(float, _nnls_relative(x, t))))
    section["host"] = dict.fromkeys(HOST, 0.0)
    ops = Operators(section)
    measured = np.asarray(seconds, dtype=np.float64)
    device = np.array([ops.device_time(s) for s in shapes])
    x = np.array([[1.0, s.num_seqs, s.num_tokens] for s in shapes])
    from scipy.optimize import nnls

    # host = what the whole step took beyond its operators; weighted by 1/measured (relative error)
    host, _ = nnls(x / measured[:, None], (measured - device) / measured)
    section["host"] = dict(zip(HOST, map(float, host)))
    pred = device + x @ host
    rel = np.abs(pred - measured) / measured
    section["fit"] = {
        "samples": len(measured),
        "median_abs_rel_err": float(np.median(rel)),
        "p90_abs_rel_err": float(np.quantile(rel, 0.9)),
        "device_share_median": float(np.median(device / pred)),
    }
    benched = (*CURVES, "attn_prefill", "attn_decode")
    section["microbenchmarks"] = {k: [list(map(float, row)) for row in samples[k]] for k in benched}
    return section


class OperatorCost(ProfileCost):
    """executor.cost_model=operators: a profile's operator section prices each step. The profile's checks
    (model, kernel, dtype, calibrated range) are ProfileCost's."""

    name = "operators"
    tensor_parallel = None  # per-operator times of one whole model: not split over ranks

    def __init__(
        self,
        path,
        model: str,
        kernel: str,
        dtype: str,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        allow_extrapolation: bool = False,
    ):
        """The limits are checked against the microbenchmarks' range (rows and tokens timed), not the
        whole steps': an operator model prices batches from its parts, within the parts' measured grid."""
        super().__init__(path, model, kernel, dtype, allow_extrapolation=True)
        section = self.profile.get("operators")
        if not section:
            raise ValueError(
                f"profile {self.path} has no operator microbenchmarks (calibrated with --no-operators, or "
                "before they existed): re-run `python -m experiments.calibration.calibrate`, or use "
                "executor.cost_model=profile"
            )
        self.operators = Operators(section)
        seen = {"max_seqs": max(section["logits"]["x"]), "max_tokens": max(section["linear"]["x"])}
        beyond = [
            f"{name}={limit} (microbenchmarked up to {seen[key]:g})"
            for name, limit, key in (
                ("max_num_seqs", max_num_seqs, "max_seqs"),
                ("max_num_batched_tokens", max_num_batched_tokens, "max_tokens"),
            )
            if limit is not None and limit > seen[key]
        ]
        if beyond and not allow_extrapolation:
            raise ValueError(
                f"profile {self.path} cannot price this run's batches by operators: {', '.join(beyond)}; "
                "calibrate with these limits, or set executor.allow_extrapolation=true"
            )

    @property
    def identity(self) -> dict:
        return {**super().identity, "cost_model": self.name, "operators_fit": self.profile["operators"].get("fit")}

    def step_time(self, s: StepShape) -> float:
        return self.operators.step_time(s)
