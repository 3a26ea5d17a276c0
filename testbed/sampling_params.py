"""Per-request sampling settings, validated on construction (vLLM's names and meanings).

Every value that could fail inside the sampler (and so fail every request sharing its step) is refused
here: a wrong type raises TypeError, an impossible value ValueError, each with the field's name. One value
is changed instead of refused, as vLLM does (vllm/sampling_params.py, `_MAX_TEMP`): a temperature in
(0, 0.01) is raised to 0.01, because logits / temperature overflows float32 for tiny temperatures
(below ~1e-37 every logit becomes inf and the softmax NaN); temperature 0 stays greedy.
"""

import logging
import math
from dataclasses import dataclass, field

from testbed.validation import is_int, is_real

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-2  # vLLM's _MAX_TEMP: positive temperatures below it are raised to it
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy; (0, 0.01) is raised to 0.01
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0  # drop tokens below min_p * p(max)
    max_tokens: int | None = 16  # None = up to the model's context
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)  # stop strings, matched on detokenized text
    ignore_eos: bool = False
    seed: int | None = None  # per-request generator: same seed, same tokens
    logprobs: int | None = None  # return the chosen token's logprob when not None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._check_types()
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, "must be finite and >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be -1, 0 or >= 1"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be >= 1"),
            ("logprobs", self.logprobs is None or self.logprobs >= 0, "must be >= 0"),
            ("seed", self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1], "must be in [-2**63, 2**64)"),
            ("stop", all(s != "" for s in self.stop), "strings must be non-empty"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} {rule}, got {getattr(self, name)!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            logger.warning(
                "temperature %g is below %g, where float32 logits overflow; using %g",
                self.temperature,
                MIN_TEMPERATURE,
                MIN_TEMPERATURE,
            )
            self.temperature = MIN_TEMPERATURE

    def _check_types(self) -> None:
        expected = [
            ("temperature", is_real(self.temperature), "a number"),
            ("top_p", is_real(self.top_p), "a number"),
            ("top_k", is_int(self.top_k), "an int"),
            ("min_p", is_real(self.min_p), "a number"),
            ("max_tokens", self.max_tokens is None or is_int(self.max_tokens), "an int or None"),
            ("seed", self.seed is None or is_int(self.seed), "an int or None"),
            ("logprobs", self.logprobs is None or is_int(self.logprobs), "an int or None"),
            ("ignore_eos", isinstance(self.ignore_eos, bool), "a bool"),
            ("stop", all(isinstance(s, str) for s in self.stop), "a str or a list of str"),
            ("stop_token_ids", all(is_int(t) for t in self.stop_token_ids), "a list of int token ids"),
        ]
        for name, ok, kind in expected:
            if not ok:
                raise TypeError(f"{name} must be {kind}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
