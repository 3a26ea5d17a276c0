"""What the engine returns: vLLM's RequestOutput / CompletionOutput shape."""
from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    finish_reason: str | None = None      # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    new_token_ids: list[int] = field(default_factory=list)   # tokens produced by the step that returned this
    metrics: RequestMetrics | None = None
    prompt: str | None = None
