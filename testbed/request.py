"""A request's state as the scheduler and model runner see it."""

import enum
import time

from testbed.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"  # EOS or a stop token / string
    FINISHED_LENGTH = "length"  # max_tokens or the model's context
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # a failure while serving it (vLLM v1's FINISHED_ERROR); the message in Request.error

    def __init__(self, value: str):
        # a plain attribute, not a property: it is read for every request several times a step
        self.finished = value in ("stop", "length", "abort", "error")


class Request:
    """Prompt + output tokens and how many of them have KV in the cache (`num_computed_tokens`).

    Every scheduling decision is "compute the next n tokens of this request": prefill chunks,
    decode, prefix hits (start past the cached length) and recompute preemption (reset to 0).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        eos_token_ids=(),
        group=None,
        index: int = 0,
    ):
        self.request_id = request_id
        # the caller's list itself, not a copy (as vLLM v1's Request): nothing changes a prompt, and a replay's
        # prompts hold millions of tokens; all_token_ids below is the request's own
        self.prompt_token_ids = prompt_token_ids if type(prompt_token_ids) is list else list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.seq_no = 0  # admission order, set by the scheduler (tie-breaker)
        self.eos_token_ids = frozenset(eos_token_ids)
        # token ids that may end the request (EOS unless ignored, stop tokens): one set lookup per token
        # sampled; which of them it was is sorted out only when one comes (testbed.stopping.check_token_stop)
        self.stop_check_ids = frozenset(sampling_params.stop_token_ids).union(
            () if sampling_params.ignore_eos else self.eos_token_ids
        )
        # length at which it ends: prompt + max_tokens, capped by the scheduler at max_model_len
        max_tokens = sampling_params.max_tokens
        self.max_num_tokens = len(self.prompt_token_ids) + max_tokens if max_tokens is not None else 2**62
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.spec_token_ids: list[int] = []  # proposed, not yet verified (speculative decoding)
        self.output_logprobs: list = []  # per output token: {token id: Logprob} (testbed.executor.logprobs)
        self.cumulative_logprob = 0.0  # sum of the output tokens' logprobs, kept when logprobs are computed
        # per prompt token: {token id: Logprob}, None for the first; filled as prefill chunks run
        self.prompt_logprobs: list | None = [None] if sampling_params.prompt_logprobs is not None else None
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0  # tokens with KV, counting those of a step scheduled and not yet run
        self.num_output_placeholders = 0  # tokens steps in flight will append (async scheduling: at most 1)
        self.num_cached_tokens = -1  # prefix-cache hit at first scheduling; -1 = not yet scheduled
        self.num_preemptions = 0
        self.block_hashes: list[int] = []  # chained hashes of full blocks, grown lazily
        # timestamps on the engine clock (time.monotonic unless the engine is given another clock)
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.token_times: list[float] = []
        self.finish_time: float | None = None
        self.stop_reason: int | str | None = None
        self.error: str | None = None  # why it finished with FINISHED_ERROR
        # parallel sampling: the SequenceGroup this sequence belongs to (testbed.sequence_group), its index
        # there (CompletionOutput.index) and the id its outputs carry (the group's); None / 0 / own id alone
        self.group = group
        self.index = index
        self.output_id = group.request_id if group is not None else request_id
        # whether its outputs carry logprobs, and whether it computes them (a group's sequences may compute
        # logprobs the request did not ask for: best_of ranks by them); read for every output built
        self.computes_logprobs = sampling_params.logprobs is not None
        self.returns_logprobs = (sampling_params if group is None else group.params).logprobs is not None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int, logprob: dict | None, now: float) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprob is not None:
            self.output_logprobs.append(logprob)
            self.cumulative_logprob += logprob[token_id].logprob
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, prompt={self.num_prompt_tokens}, out={self.num_output_tokens}, "
            f"computed={self.num_computed_tokens}, {self.status.value})"
        )
