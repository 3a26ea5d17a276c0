"""One poisoned request among healthy ones: the workload and the injections the isolation tests share.

A poisoned request is marked by the first token of its prompt. Each injection monkeypatches one real
component so that it raises whenever the poisoned request is among the requests it is given, as a bug
triggered by one request's data would: a batch that holds it fails, and so does the request alone."""

import pytest

from testbed import SamplingParams

POISON_TOKEN = 4000  # first prompt token of the poisoned request (the tiny model's vocabulary is 4096)
MAX_TOKENS = 8


def healthy_prompts(n: int = 20) -> list[list[int]]:
    """Repeating patterns (so the n-gram proposer finds drafts), of several lengths."""
    return [[5 + i, 6, 7, 8 + i] * (1 + i % 3) + [100 + i] for i in range(n)]


def healthy_params(n: int = 20, with_processors: bool = True) -> list[SamplingParams]:
    """Greedy, greedy with a repetition penalty (logits processors), seeded sampling, greedy with a stop
    string that never appears: the sampler's batch paths side by side."""
    base = {"max_tokens": MAX_TOKENS, "ignore_eos": True}
    kinds = [
        SamplingParams(temperature=0, **base),
        SamplingParams(temperature=0, repetition_penalty=1.3, **base),
        SamplingParams(temperature=0.9, seed=7, **base),
        SamplingParams(temperature=0, stop=["never appears in the text"], **base),
    ]
    if not with_processors:
        kinds = [k for k in kinds if not k.uses_processors]
    return [kinds[i % len(kinds)] for i in range(n)]


def is_poisoned(request) -> bool:
    return request.prompt_token_ids[0] == POISON_TOKEN


class Injection:
    """Where the poison acts: the parameters that route the poisoned request through that component,
    the component's patch, and what the failed request's message says: which stage failed (`stage`, or
    `speculative_stage` with speculative decoding on) and the error raised (`marker`)."""

    def __init__(self, name: str, params: dict, stage: str, marker: str, speculative_stage: str | None = None):
        self.name, self.params, self.stage, self.marker = name, params, stage, marker
        self.speculative_stage = speculative_stage or stage
        self.failed_batch_sizes: list[int] = []  # how many requests the component had each time it raised

    def check_message(self, error: str | None, speculative: bool) -> None:
        stage = self.speculative_stage if speculative else self.stage
        assert error and error.startswith(f"{stage} failed: ") and self.marker in error, error

    def poisoned_params(self) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, **self.params)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.failed_batch_sizes = []
        getattr(self, f"_install_{self.name}")(monkeypatch)

    def shared_a_batch(self) -> bool:
        """Whether the poison raised at least once with other requests in the batch (what isolation is about)."""
        return max(self.failed_batch_sizes, default=0) > 1

    def _install_processors(self, monkeypatch):
        from testbed.executor.logits_processors import LogitsProcessors

        apply = LogitsProcessors.apply
        failed = self.failed_batch_sizes

        def poisoned(self, logits, rows, requests):  # from its third token on: batches hold drafts by then
            if any(is_poisoned(requests[i]) and requests[i].num_output_tokens >= 2 for i in rows):
                failed.append(len(requests))
                raise RuntimeError("poisoned logits processor")
            return apply(self, logits, rows, requests)

        monkeypatch.setattr(LogitsProcessors, "apply", poisoned)

    def _install_stop_strings(self, monkeypatch):
        import testbed.output_processor as output_processor

        find = output_processor.find_stop_string

        def poisoned(text, stops, start):
            if "<poison>" in stops:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "poisoned detokenizer")
            return find(text, stops, start)

        monkeypatch.setattr(output_processor, "find_stop_string", poisoned)

    def _install_prompt_logprobs(self, monkeypatch):
        import testbed.executor.model_runner as model_runner

        compute = model_runner.prompt_logprobs
        failed = self.failed_batch_sizes

        def poisoned(out, hidden, compute_logits, wanted=None):
            rows = wanted if wanted is not None else model_runner.wanting_prompt_logprobs(out)
            if any(is_poisoned(out.requests[i]) for i in rows):
                failed.append(len(out.requests) if wanted is None else len(wanted))
                raise IndexError("poisoned prompt logprobs")
            return compute(out, hidden, compute_logits, wanted)

        monkeypatch.setattr(model_runner, "prompt_logprobs", poisoned)

    def _install_proposal(self, monkeypatch):
        from testbed.spec.ngram import NgramProposer

        propose = NgramProposer.propose
        failed = self.failed_batch_sizes

        def poisoned(self, requests, num_tokens):
            if any(is_poisoned(r) for r in requests):
                failed.append(len(requests))
                raise ValueError("poisoned proposer")
            return propose(self, requests, num_tokens)

        monkeypatch.setattr(NgramProposer, "propose", poisoned)


INJECTIONS = {
    # with speculation, the batch holds drafts by the poisoned request's third token: its row is sampled
    # inside the verification
    "processors": Injection(
        "processors", {"repetition_penalty": 1.2}, "sampling", "poisoned logits processor", "speculative verification"
    ),
    "stop_strings": Injection("stop_strings", {"stop": ["<poison>"]}, "stop-string detection", "poisoned detokenizer"),
    "prompt_logprobs": Injection("prompt_logprobs", {"prompt_logprobs": 1}, "prompt logprobs", "poisoned prompt"),
    "proposal": Injection("proposal", {}, "speculative proposal", "poisoned proposer"),
}
