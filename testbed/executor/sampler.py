"""Batched sampling with per-request settings, in vLLM v1's order (vllm/v1/sample/sampler.py).

For each batch of logits rows (one per request):
  1. structured output: each constrained row's grammar bitmask (testbed.structured), as vLLM applies it
     before its sampler;
  2. raw logprobs, if any row wants them: log-softmax of these logits (vLLM's default
     logprobs_mode="raw_logprobs": before penalties and temperature);
  3. logits processors (testbed.executor.logits_processors): allowed ids, bad words, min_tokens,
     logit_bias, repetition / frequency / presence penalties;
  4. greedy rows: argmax. Other rows: temperature, then min-p, then top-k and top-p (`filter_logits`),
     then one draw per row by inverse CDF: the first token whose cumulative probability exceeds
     u ~ U(0, total), one uniform number a row from the request's seeded generator or the shared one.
     (vLLM draws argmax(p / E), E ~ Exp(1) per token; the distribution is the same, and one number a row
     instead of one a vocabulary entry is ~100x less random-number work on a CPU.)
Rows without features (greedy or plain temperature / top-k / top-p / min-p) take no per-request Python
path; each feature costs only the rows that use it.
"""

import logging
import time

import torch

from testbed.executor.logits_processors import LogitsProcessors
from testbed.executor.logprobs import logprob_entries
from testbed.sampling_params import SamplingParamError, SamplingParams
from testbed.structured.grammar import GrammarBackend

logger = logging.getLogger(__name__)


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature-scaled logits with min-p, then top-k and top-p applied (masked to -inf). Rows: requests.

    vLLM's order and ties: min-p is applied first (an argmax-invariant logits processor, before the
    top-k/top-p sampler); top-k keeps every logit >= the k-th largest (ties at the boundary kept); top-p
    drops the tokens whose ascending cumulative probability stays <= 1 - p, never the most likely one
    (vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p)."""
    device = logits.device
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
    logits = logits / temps.unsqueeze(1)
    vocab = logits.shape[1]
    min_p = [p.min_p for p in params]
    if any(m > 0 for m in min_p):
        probs = logits.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * torch.tensor(min_p, device=device).unsqueeze(1)
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    top_p = [p.top_p for p in params]
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=False)
        if any(k < vocab for k in top_k):
            kth = torch.tensor([vocab - k for k in top_k], device=device).unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(sorted_logits < sorted_logits.gather(1, kth), float("-inf"))
        if any(p < 1.0 for p in top_p):
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= 1 - torch.tensor(top_p, device=device).unsqueeze(1)
            drop[:, -1] = False
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    return logits


class Sampler:
    def __init__(
        self,
        seed: int = 0,
        device="cpu",
        tokenizer=None,
        vocab_size: int | None = None,
        eos_token_ids=(),
        structured_outputs=None,  # StructuredOutputsConfig or its dict: compile limits, cache size
        max_model_len: int | None = None,
    ):
        self.default_generator = torch.Generator(device=device).manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}
        self.device = device
        self.vocab_size = vocab_size
        self.processors = LogitsProcessors(vocab_size or 0, tokenizer, eos_token_ids)
        self.grammars = GrammarBackend(
            tokenizer, vocab_size or 0, list(eos_token_ids), structured_outputs, max_model_len
        )
        self.matchers: dict[str, list] = {}  # request id -> [xgrammar matcher, output tokens it has accepted]
        self.grammar_time_s = 0.0  # structured output's cost (masks + matcher updates) since take_grammar_time()

    # ---- per request -----------------------------------------------------------------------------
    def check(self, params: SamplingParams, request_id: str = "?") -> None:
        """What needs the model: token ids within the vocabulary, bad words tokenizable, the grammar
        compiles and admits some output. Raises SamplingParamError / StructuredOutputError (ValueErrors)."""
        if self.vocab_size is None:
            return
        self.processors.check(params)
        if params.structured_outputs is not None:
            self.grammars.check(params.structured_outputs)

    def take_grammar_time(self) -> float:
        """Seconds spent on grammars since the last call (the engine reads it once a step)."""
        t, self.grammar_time_s = self.grammar_time_s, 0.0
        return t

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.default_generator
        gen = self.generators.get(request_id)
        if gen is None:
            gen = self.generators[request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        return gen

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            self.generators.pop(rid, None)
            self.matchers.pop(rid, None)
            self.processors.forget(rid)

    # ---- the batch ---------------------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, requests):
        """logits [n, vocab] fp32, one row per request (testbed.request.Request) -> (token ids, logprobs):
        logprobs None unless a request asks for them, else per row None or {token id: Logprob}."""
        params = [r.sampling_params for r in requests]
        special = [i for i, p in enumerate(params) if p.uses_processors]
        want = [i for i, p in enumerate(params) if p.logprobs is not None]
        raw = logits
        if special:
            logits = logits.clone()  # the model's logits stay raw for the fallback below
            structured = [i for i in special if params[i].structured_outputs is not None]
            if structured:
                self._apply_grammars(logits, structured, requests)
        # vLLM's "raw_logprobs": before processors and temperature (indexing copies the rows)
        raw_logprobs = logits[want].log_softmax(dim=-1) if want else None
        if special:
            self.processors.apply(logits, special, requests)
            self._revive_dead_rows(logits, raw, special)
        greedy = [p.greedy for p in params]
        tokens = logits.argmax(dim=-1)
        if not all(greedy):
            rows = [i for i, g in enumerate(greedy) if not g]
            sub = logits if len(rows) == len(params) else logits[rows]
            cdf = filter_logits(sub, [params[i] for i in rows]).softmax(dim=-1).cumsum_(dim=-1)
            u = torch.rand(len(rows), 1, generator=self.default_generator, device=cdf.device)
            seeded = [(j, i) for j, i in enumerate(rows) if params[i].seed is not None]
            for j, i in seeded:  # seeded requests draw from their own stream
                u[j] = torch.rand(1, generator=self._generator(requests[i].request_id, params[i]), device=cdf.device)
            # zero-probability tokens repeat the previous cumulative value, so `right=True` never lands on one
            drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)
            if len(rows) == len(params):
                tokens = drawn
            else:
                tokens[torch.tensor(rows, device=tokens.device)] = drawn
        logprobs: list[dict | None] | None = None
        if raw_logprobs is not None:
            idx = torch.tensor(want, device=tokens.device)
            entries = logprob_entries(raw_logprobs, tokens[idx], [params[i].logprobs for i in want])
            logprobs = [None] * len(params)
            for i, entry in zip(want, entries):
                logprobs[i] = entry
        return tokens.tolist(), logprobs

    def _apply_grammars(self, logits: torch.Tensor, rows: list[int], requests) -> None:
        """Bring each row's matcher up to its request's output, fill its bitmask, mask the rows at once."""
        start = time.perf_counter()
        bitmask = self.grammars.allocate_bitmask(logits.shape[0])  # row i masks logits row i
        masked, stop_only = [], []
        for i in rows:
            request = requests[i]
            state = self.matchers.get(request.request_id)
            if state is None:
                state = self.matchers[request.request_id] = [
                    self.grammars.new_matcher(request.sampling_params.structured_outputs),
                    0,
                ]
            matcher, done = state
            for token in request.output_token_ids[done:]:
                if not matcher.is_terminated() and not matcher.accept_token(token):
                    logger.warning("request %s: token %d breaks its grammar", request.request_id, token)
            state[1] = len(request.output_token_ids)
            if matcher.is_terminated():
                stop_only.append(i)  # the grammar is done: only a stop token may follow (ignore_eos)
            else:
                matcher.fill_next_token_bitmask(bitmask, i)
                masked.append(i)
        if masked:
            self.grammars.apply_bitmask(logits, bitmask, masked)
        for i in stop_only:
            stops = self.grammars.stop_token_ids
            keep = logits[i, stops].clone()
            logits[i] = float("-inf")
            logits[i, stops] = keep
        self.grammar_time_s += time.perf_counter() - start

    @staticmethod
    def _revive_dead_rows(logits, raw, rows: list[int]) -> None:
        """A row whose constraints exclude every token (e.g. min_tokens against a finished grammar,
        allowed ids outside it) samples from the model's own logits rather than from nothing."""
        idx = torch.tensor(rows, device=logits.device)
        dead = ~torch.isfinite(logits[idx]).any(dim=-1)
        if dead.any():
            for i in idx[dead].tolist():
                logger.warning("row %d: its sampling constraints exclude every token; sampling unconstrained", i)
                logits[i] = raw[i]


__all__ = ["Sampler", "SamplingParamError", "filter_logits"]
