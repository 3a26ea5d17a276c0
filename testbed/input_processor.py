"""Checks a request before it enters the engine: types, prompt length and vocabulary, sampling parameters
(the sampler's vocabulary-dependent checks), KV capacity for its final length, and a parallel-sampling
group's seats and blocks. vLLM v1's input processor is the model: one place refuses what can never run.
A wrong type is a TypeError, a value that cannot work a ValueError, each naming the request. SamplingParams
checks its own fields when it is built (vLLM's SamplingParams._verify_args does too); what depends on the
engine (vocabulary, lengths, the cache) is checked here."""

import marshal
from collections.abc import Sequence

import numpy as np

from testbed.config import EngineConfig
from testbed.sampling_params import SEED_RANGE, SamplingParamError, SamplingParams
from testbed.validation import is_int


class InputProcessor:
    def __init__(self, config: EngineConfig, max_model_len: int, vocab_size: int, kv, sampler):
        self.config, self.max_model_len, self.vocab_size = config, max_model_len, vocab_size
        self.kv, self.sampler = kv, sampler

    def check(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str = "?") -> None:
        """Raise before any work if this request can never run."""
        bounds = plain_int_bounds(prompt_token_ids)
        if bounds is None:
            check_types(prompt_token_ids, params, request_id)
        else:  # a list of plain ints: what check_types would have found
            check_params_type(params, request_id)
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError(f"request {request_id}: the prompt is empty")
        if n >= self.max_model_len:
            raise ValueError(
                f"request {request_id}: prompt of {n} tokens leaves no room to generate within "
                f"max_model_len={self.max_model_len}"
            )
        vocab = self.vocab_size
        if bounds is None:
            outside = min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab  # C loops
        else:
            outside = bounds[0] < 0 or bounds[1] >= vocab
        if outside:  # the culprit only on failure
            bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
            raise ValueError(f"request {request_id}: token id {bad[0]} outside the vocabulary [0, {self.vocab_size})")
        scheduler = self.config.scheduler
        if not scheduler.enable_chunked_prefill and n > scheduler.max_num_batched_tokens:
            raise ValueError(
                f"request {request_id}: prompt of {n} tokens exceeds max_num_batched_tokens="
                f"{scheduler.max_num_batched_tokens} and chunked prefill is off"
            )
        final_len = min(n + (params.max_tokens or self.max_model_len), self.max_model_len)
        self.sampler.check(params, request_id)
        need = self.kv.blocks_for_request(final_len)
        if need > self.kv.num_blocks:
            raise ValueError(
                f"request {request_id}: {final_len} tokens need {need} KV blocks of "
                f"{self.kv.block_size}, the whole cache has {self.kv.num_blocks}"
            )
        if params.num_sequences > 1:
            self._check_group(n, final_len, params, request_id)

    def _check_group(self, num_prompt: int, final_len: int, params: SamplingParams, request_id: str) -> None:
        """A parallel-sampling group must be able to run as one (testbed.sequence_group): seats for all its
        sequences, and room for all of them at their final length at once, the prompt's full blocks counted
        once (the partly filled one is copied by each sequence)."""
        k, bs = params.num_sequences, self.kv.block_size
        what, param = f"n={params.n}", "n"
        if params.best_of is not None and params.best_of > params.n:
            what, param = f"best_of={params.best_of}", "best_of"
        if not self.kv.supports_fork:
            raise SamplingParamError(
                param,
                f"request {request_id}: {what} needs sequences sharing KV blocks, which cache={self.kv.name} "
                "cannot do (use cache=paged)",
            )
        if params.seed is not None and params.seed + k - 1 > SEED_RANGE[1]:
            raise SamplingParamError(
                "seed",
                f"request {request_id}: sequence {k - 1} would use seed {params.seed} + "
                f"{k - 1}, beyond the largest seed {SEED_RANGE[1]}",
            )
        max_seqs = self.config.scheduler.max_num_seqs
        if k > max_seqs:
            raise SamplingParamError(
                param, f"request {request_id}: {what} sequences cannot run together with max_num_seqs={max_seqs}"
            )
        shared = (num_prompt - 1) // bs
        need = shared + k * (self.kv.blocks_for_request(final_len) - shared)
        if need > self.kv.num_blocks:
            raise SamplingParamError(
                param,
                f"request {request_id}: {what} sequences of up to {final_len} tokens need {need} KV blocks of {bs} "
                f"together ({shared} shared), the whole cache has {self.kv.num_blocks}",
            )


def check_types(prompt_token_ids, params, request_id) -> None:
    """add_request's arguments have the right types (their values are checked by InputProcessor.check)."""
    if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
        raise TypeError(
            f"request {request_id}: prompt_token_ids must be a list of int token ids, got "
            f"{type(prompt_token_ids).__name__} (tokenize text first, or use LLM.generate)"
        )
    if not set(map(type, prompt_token_ids)) <= {int}:  # fast path (C loops); numpy ints are fine too
        for i, t in enumerate(prompt_token_ids):
            if not is_int(t):
                raise TypeError(
                    f"request {request_id}: token ids must be ints, got {t!r} ({type(t).__name__}) at position {i}"
                )
    check_params_type(params, request_id)


def check_params_type(params, request_id) -> None:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"request {request_id}: sampling params must be SamplingParams, got {type(params).__name__}")


# marshal (format version 2: no back-references) writes a list as b"[" + its length (4 bytes), then each item;
# a plain int of the int32 range as b"i" + 4 bytes, little-endian. Every other item is written otherwise
# (another code byte, another size) or refused: bool, int subclasses, numpy ints, floats, big ints.
_MARSHAL_INT = np.dtype([("code", "u1"), ("value", "<i4")])


def plain_int_bounds(prompt_token_ids) -> tuple[int, int] | None:
    """(min, max) of a non-empty list whose items are all plain ints (type int, not bool) in the int32 range,
    from one C pass over it (marshal.dumps) instead of three (check_types' type pass, min, max); None for
    anything else, which the caller checks item by item as before. The items are written one after another
    from byte 5: while each is b"i" + 4 bytes the next starts on the 5-byte grid, so the first item of any
    other kind starts on it with another code byte; n grid codes b"i" and a length of 5 + 5n mean n such ints."""
    n = len(prompt_token_ids) if type(prompt_token_ids) is list else 0
    if not 0 < n < 2**31:
        return None
    try:
        data = marshal.dumps(prompt_token_ids, 2)
    except ValueError:  # an item marshal cannot write
        return None
    if len(data) != 5 + 5 * n or data[:5] != b"[" + n.to_bytes(4, "little"):
        return None
    items = np.frombuffer(data, dtype=_MARSHAL_INT, offset=5)
    if not (items["code"] == ord("i")).all():
        return None
    return int(items["value"].min()), int(items["value"].max())


class ValidatedRequests:
    """Requests a replica set has validated, by id, so that submitting one does not check it again
    (Engine.add_request's `validated`): only when the very prompt and params objects validated come back
    (a replay validates its whole trace before it starts, then submits the same objects unchanged);
    anything else, e.g. params rebuilt for another role, is checked as usual."""

    def __init__(self) -> None:
        self._checked: dict[str, tuple] = {}

    def add(self, request_id: str, prompt_token_ids, params) -> None:
        self._checked[request_id] = (prompt_token_ids, params)

    def take(self, request_id: str, prompt_token_ids, params) -> bool:
        """Whether this request was validated with these objects (forgotten either way)."""
        checked = self._checked.pop(request_id, None)
        return checked is not None and checked[0] is prompt_token_ids and checked[1] is params
