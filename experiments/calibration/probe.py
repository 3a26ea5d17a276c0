"""A fixed probe of the machine's speed, and the calibration's self-check.

The probe is a few representative steps of the real engine (prefill chunks, a mixed step, decode steps of
a small batch), always the same shape, driven back to back; its time is the sum of those step periods,
the median of `repeats` runs. Timed at the start, middle and end of a calibration (and before and after
each real run of the fidelity study), it shows whether the machine's speed moved while a profile was being measured:
a profile fitted across a drift describes neither speed.

The self-check refuses a calibration whose fit does not describe its own data (median |relative error|
above `max_fit_error`) or whose probe moved (drift above `max_drift`); both thresholds default to 10%.
"""

import itertools
import statistics
from dataclasses import dataclass

from experiments.calibration.step_shapes import measure

# (prompt, output) lengths: two long and two short prompts, six outputs each, so the probe holds prefill
# chunks, a step mixing the last chunk with decodes, and pure decode steps of four sequences
PROBE = ((128, 6), (128, 6), (32, 6), (32, 6))
MAX_FIT_ERROR = 0.10
MAX_DRIFT = 0.10

_seeds = itertools.count(10_000)  # a fresh prompt per probe: never a prefix-cache hit on an earlier one


def probe_lengths(max_len: int) -> list[tuple[int, int]]:
    return [(min(p, max_len - o - 1), o) for p, o in PROBE]


def probe_seconds(engine, repeats: int = 3) -> float:
    """Median over `repeats` runs of the probe's total step time (seconds) on this engine now."""
    lengths = probe_lengths(engine.max_model_len)
    totals = []
    for _ in range(repeats):
        _, periods = measure(engine, lengths, seed=next(_seeds))
        totals.append(sum(periods))
    return statistics.median(totals)


def drift(probes: list[float]) -> float:
    """How far the probe moved: (slowest - fastest) / fastest over the timings given."""
    return (max(probes) - min(probes)) / min(probes) if probes else 0.0


@dataclass(frozen=True)
class SelfCheck:
    fit_median_abs_rel_err: float
    probe_seconds: list[float]  # start, middle, end
    drift: float
    max_fit_error: float
    max_drift: float

    @classmethod
    def of(cls, fit_error: float, probes: list[float], max_fit_error=MAX_FIT_ERROR, max_drift=MAX_DRIFT):
        return cls(fit_error, list(probes), drift(probes), max_fit_error, max_drift)

    @property
    def failures(self) -> list[str]:
        out = []
        if self.fit_median_abs_rel_err > self.max_fit_error:
            out.append(
                f"the fit's median |error| is {100 * self.fit_median_abs_rel_err:.1f}% "
                f"(limit {100 * self.max_fit_error:g}%): the model does not describe its own calibration steps"
            )
        if self.drift > self.max_drift:
            probes = ", ".join(f"{1e3 * p:.1f}" for p in self.probe_seconds)
            out.append(
                f"the probe drifted {100 * self.drift:.1f}% (limit {100 * self.max_drift:g}%; start/middle/end "
                f"{probes} ms): the machine's speed changed while calibrating"
            )
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_dict(self, forced: bool) -> dict:
        return {
            "passed": self.passed,
            "forced": forced,
            "failures": self.failures,
            "fit_median_abs_rel_err": self.fit_median_abs_rel_err,
            "probe_seconds": self.probe_seconds,
            "drift": self.drift,
            "max_fit_error": self.max_fit_error,
            "max_drift": self.max_drift,
        }
