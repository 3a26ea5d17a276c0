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

from testbed.structured.params import StructuredOutputsParams
from testbed.validation import is_int, is_real

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-2  # vLLM's _MAX_TEMP: positive temperatures below it are raised to it
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
# vLLM's default cap on sample and prompt logprobs (EngineArgs.max_logprobs)
MAX_LOGPROBS = 20
# presence/frequency penalty range: OpenAI's, which vLLM's SamplingParams._verify_args enforces
PENALTY_RANGE = 2.0
# vLLM's cap on n (envs.VLLM_MAX_N_SEQUENCES default); the engine's max_num_seqs is usually the tighter one
MAX_N_SEQUENCES = 16384


class SamplingParamError(ValueError):
    """A bad sampling parameter; `param` names it (the HTTP error body's `param`)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


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
    # ---- logits processors, logprobs and structured output (vLLM's semantics; testbed.executor.sampler) ----
    logprobs: int | None = None  # None: none; k: the sampled token's logprob + the k most likely (k <= 20)
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's logprob + the k most likely
    presence_penalty: float = 0.0  # subtracted once from every token already generated, in [-2, 2]
    frequency_penalty: float = 0.0  # subtracted per occurrence among generated tokens, in [-2, 2]
    repetition_penalty: float = 1.0  # > 0; logits of prompt or generated tokens divided (>0) / multiplied (<0)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # EOS and stop_token_ids are banned until this many tokens are generated
    bad_words: list[str] = field(default_factory=list)  # never generated (tokenized by the engine)
    bad_words_token_ids: list[list[int]] = field(default_factory=list)  # token sequences never completed
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    structured_outputs: StructuredOutputsParams | None = None  # JSON schema / regex / choice / grammar
    # ---- parallel sampling (vLLM's n / best_of; testbed.sequence_group) ----
    n: int = 1  # completions returned
    best_of: int | None = None  # sequences sampled (>= n; None = n); the n with the highest cumulative logprob return
    # vLLM's free-form args for plugins; read here: "request_class", the workload label of a request's cached
    # blocks (cache.eviction=workload, testbed/core/workload_eviction.py)
    extra_args: dict | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._check_types()
        self._check_constraint_type()
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, "must be finite and >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be -1, 0 or >= 1"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be >= 1"),
            ("seed", self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1], "must be in [-2**63, 2**64)"),
            ("stop", all(s != "" for s in self.stop), "strings must be non-empty"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise SamplingParamError(name, f"{name} {rule}, got {getattr(self, name)!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            logger.warning(
                "temperature %g is below %g, where float32 logits overflow; using %g",
                self.temperature,
                MIN_TEMPERATURE,
                MIN_TEMPERATURE,
            )
            self.temperature = MIN_TEMPERATURE
        self._check_processors()
        self._check_parallel()

    def _check_types(self) -> None:
        expected = [
            ("temperature", is_real(self.temperature), "a number"),
            ("top_p", is_real(self.top_p), "a number"),
            ("top_k", is_int(self.top_k), "an int"),
            ("min_p", is_real(self.min_p), "a number"),
            ("max_tokens", self.max_tokens is None or is_int(self.max_tokens), "an int or None"),
            ("seed", self.seed is None or is_int(self.seed), "an int or None"),
            ("logprobs", self.logprobs is None or is_int(self.logprobs), "an int or None"),
            ("prompt_logprobs", self.prompt_logprobs is None or is_int(self.prompt_logprobs), "an int or None"),
            ("presence_penalty", is_real(self.presence_penalty), "a number"),
            ("frequency_penalty", is_real(self.frequency_penalty), "a number"),
            ("repetition_penalty", is_real(self.repetition_penalty), "a number"),
            ("min_tokens", is_int(self.min_tokens), "an int"),
            ("ignore_eos", isinstance(self.ignore_eos, bool), "a bool"),
            ("stop", all(isinstance(s, str) for s in self.stop), "a str or a list of str"),
            ("stop_token_ids", all(is_int(t) for t in self.stop_token_ids), "a list of int token ids"),
            ("n", is_int(self.n), "an int"),
            ("best_of", self.best_of is None or is_int(self.best_of), "an int or None"),
            ("extra_args", self.extra_args is None or isinstance(self.extra_args, dict), "a dict or None"),
        ]
        for name, ok, kind in expected:
            if not ok:
                raise TypeError(f"{name} must be {kind}, got {getattr(self, name)!r}")

    def _check_constraint_type(self) -> None:
        """structured_outputs as a StructuredOutputsParams, or its fields as a dict (converted); bad_words
        as strings (token ids go in bad_words_token_ids)."""
        so = self.structured_outputs
        if isinstance(so, dict):
            try:
                self.structured_outputs = StructuredOutputsParams(**so)
            except TypeError as e:  # a key that is not a field
                raise SamplingParamError("structured_outputs", f"structured_outputs: {e}") from None
        elif so is not None and not isinstance(so, StructuredOutputsParams):
            raise TypeError(f"structured_outputs must be a StructuredOutputsParams or a dict, got {so!r}")
        words = self.bad_words
        if not isinstance(words, (str, list, tuple)) or (
            not isinstance(words, str) and not all(isinstance(w, str) for w in words)
        ):
            raise TypeError(f"bad_words must be a str or a list of str (ids: bad_words_token_ids), got {words!r}")

    def _check_processors(self) -> None:
        """Logprobs, penalties, biases, bans and structured output: vLLM's rules and messages
        (vllm/sampling_params.py SamplingParams._verify_args, v1 Processor._validate_logprobs)."""
        self.bad_words = [self.bad_words] if isinstance(self.bad_words, str) else list(self.bad_words or [])
        self.bad_words_token_ids = [list(ids) for ids in self.bad_words_token_ids or []]
        self.logit_bias = dict(self.logit_bias or {})
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise SamplingParamError(name, f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -PENALTY_RANGE <= value <= PENALTY_RANGE:
                raise SamplingParamError(name, f"{name} must be in [-2, 2], got {value}")
        if not 0 < self.repetition_penalty < math.inf:
            raise SamplingParamError(
                "repetition_penalty",
                f"repetition_penalty must be finite and greater than zero, got {self.repetition_penalty}",
            )
        if not (isinstance(self.min_tokens, int) and self.min_tokens >= 0):
            raise SamplingParamError("min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise SamplingParamError(
                "min_tokens", f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}"
            )
        for token, bias in self.logit_bias.items():
            if not isinstance(token, int):
                raise SamplingParamError("logit_bias", f"logit_bias keys must be token ids, got {token!r}")
            if bias != bias or abs(bias) == float("inf"):
                raise SamplingParamError("logit_bias", f"logit_bias of token {token} must be finite, got {bias}")
        if any(not ids for ids in self.bad_words_token_ids):
            raise SamplingParamError("bad_words", "bad_words_token_ids holds an empty sequence")
        if any(not w.strip() for w in self.bad_words):
            raise SamplingParamError("bad_words", "bad_words must be non-empty strings")
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise SamplingParamError("allowed_token_ids", "allowed_token_ids must not be empty")
        # read by the sampler for every request every step: decided once here (params are not mutated later)
        self._uses_processors = bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.bad_words
            or self.bad_words_token_ids
            or self.allowed_token_ids is not None
            or self.structured_outputs is not None
        )

    def _check_parallel(self) -> None:
        """n and best_of: vLLM's rules and messages (vllm/sampling_params.py _verify_num_sequences,
        _verify_greedy_sampling; best_of as vLLM v0 had it)."""
        for name in ("n", "best_of"):
            value = getattr(self, name)
            if value is None:
                continue
            if value < 1:
                raise SamplingParamError(name, f"{name} must be at least 1, got {value}.")
            if value > MAX_N_SEQUENCES:
                raise SamplingParamError(name, f"{name} must be at most {MAX_N_SEQUENCES}, got {value}.")
        if self.best_of is not None and self.best_of < self.n:
            raise SamplingParamError(
                "best_of", f"best_of must be greater than or equal to n, got n={self.n} and best_of={self.best_of}."
            )
        if self.greedy and self.n > 1:  # n greedy sequences would all be the same one
            raise SamplingParamError("n", f"n must be 1 when using greedy sampling, got {self.n}.")
        if self.greedy and self.num_sequences > 1:
            raise SamplingParamError("best_of", f"best_of must be 1 when using greedy sampling, got {self.best_of}.")

    @property
    def num_sequences(self) -> int:
        """Sequences sampled for the request: best_of, or n."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_processors(self) -> bool:
        """Anything beyond temperature / top-k / top-p / min-p: the sampler then does per-request work."""
        return self._uses_processors
