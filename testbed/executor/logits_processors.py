"""The history-dependent logits processors of vLLM's sampler, batched over the rows that use them.

Order and meanings follow vLLM v1 (vllm/v1/sample/sampler.py `apply_logits_processors`,
vllm/v1/sample/logits_processor/builtin.py, vllm/model_executor/layers/utils.py `apply_penalties`,
vllm/v1/sample/ops/bad_words.py):
  1. allowed_token_ids: every other token -> -inf
  2. bad words: a banned sequence's last token -> -inf when the output ends with the rest of it
  3. min_tokens: EOS (unless ignore_eos) and stop_token_ids -> -inf while fewer tokens are generated
  4. logit_bias: added to the token's logit
  5. penalties: repetition (prompt and output tokens: a positive logit divided by it, a negative one
     multiplied), then frequency (times the count in the output) and presence (once if in the output)
     subtracted, OpenAI's definition.
Per-request state (output token counts, the prompt's token set, tokenized bad words) lives here keyed
by request id, grows from the request's own token lists (so preemption and recompute need nothing) and
is dropped when the request finishes (`forget`). Penalties touch only the tokens a request has seen
(sparse), not the whole vocabulary as vLLM's GPU kernel does: the same numbers at O(tokens seen) on a CPU.
"""

from dataclasses import dataclass, field

import torch

from testbed.sampling_params import SamplingParamError, SamplingParams


@dataclass
class _RequestState:
    penalized: bool = False  # the request has a penalty
    # the tokens a penalty may touch: the prompt's (repetition penalty only) and the generated ones,
    # with how often each was generated (0 for prompt-only tokens)
    seen_ids: list[int] = field(default_factory=list)
    seen_counts: list[float] = field(default_factory=list)
    position: dict[int, int] = field(default_factory=dict)  # token id -> its index in seen_ids
    num_counted: int = 0  # output tokens already counted
    bad_words: list[list[int]] | None = None  # token sequences (bad_words tokenized + bad_words_token_ids)


def tokenize_bad_words(tokenizer, words: list[str]) -> list[list[int]]:
    """vLLM's SamplingParams.update_from_tokenizer: each word as it would start the text and, when that
    gives a different first token of the same length, as it would follow a space."""
    sequences: list[list[int]] = []
    for word in words:
        for prefix in ("", " "):
            ids = tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False)
            if not prefix or (ids[0] != sequences[-1][0] and len(ids) == len(sequences[-1])):
                sequences.append(ids)
    return sequences


class LogitsProcessors:
    def __init__(self, vocab_size: int, tokenizer=None, eos_token_ids=()):
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.state: dict[str, _RequestState] = {}

    def check(self, params: SamplingParams) -> None:
        """Raise SamplingParamError for token ids outside the vocabulary or bad words without a tokenizer."""
        vocab = self.vocab_size

        def outside(ids):
            return next((t for t in ids if not (isinstance(t, int) and 0 <= t < vocab)), None)

        for name, ids in (
            ("logit_bias", params.logit_bias),
            ("allowed_token_ids", params.allowed_token_ids or ()),
            ("bad_words", [t for seq in params.bad_words_token_ids for t in seq]),
            ("stop_token_ids", params.stop_token_ids),
        ):
            bad = outside(ids)
            if bad is not None:
                raise SamplingParamError(name, f"{name} holds token id {bad} outside the vocabulary [0, {vocab})")
        if params.bad_words and self.tokenizer is None:
            raise SamplingParamError("bad_words", "bad_words needs a model with a tokenizer (use token ids)")

    def forget(self, request_id: str) -> None:
        self.state.pop(request_id, None)

    def _state(self, request, device) -> _RequestState:
        st = self.state.get(request.request_id)
        if st is None:
            st = self.state[request.request_id] = _RequestState()
            p = request.sampling_params
            st.penalized = bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0)
            if p.repetition_penalty != 1.0:
                for token in dict.fromkeys(request.prompt_token_ids):
                    st.position[token] = len(st.seen_ids)
                    st.seen_ids.append(token)
                    st.seen_counts.append(0.0)
            if p.bad_words or p.bad_words_token_ids:
                words = tokenize_bad_words(self.tokenizer, p.bad_words) if p.bad_words else []
                st.bad_words = words + p.bad_words_token_ids
        if st.penalized and st.num_counted < len(request.output_token_ids):
            for token in request.output_token_ids[st.num_counted :]:
                pos = st.position.get(token)
                if pos is None:
                    st.position[token] = len(st.seen_ids)
                    st.seen_ids.append(token)
                    st.seen_counts.append(1.0)
                else:
                    st.seen_counts[pos] += 1.0
            st.num_counted = len(request.output_token_ids)
        return st

    def apply(self, logits: torch.Tensor, rows: list[int], requests) -> None:
        """Apply, in place, every processor of the given rows (their requests use at least one)."""
        device = logits.device
        states = [self._state(requests[i], device) for i in rows]
        neg_inf = float("-inf")
        for i, st in zip(rows, states):
            request = requests[i]
            p = request.sampling_params
            row = logits[i]
            if p.allowed_token_ids is not None:
                keep = torch.tensor(p.allowed_token_ids, dtype=torch.long, device=device)
                masked = torch.full_like(row, neg_inf)
                masked[keep] = row[keep]
                row.copy_(masked)
            if st.bad_words:
                out = request.output_token_ids
                for seq in st.bad_words:
                    prefix = len(seq) - 1
                    if prefix <= len(out) and (prefix == 0 or out[-prefix:] == seq[:-1]):
                        row[seq[-1]] = neg_inf
            if p.min_tokens and len(request.output_token_ids) < p.min_tokens:
                stops = list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_token_ids)
                if stops:
                    row[torch.tensor(stops, dtype=torch.long, device=device)] = neg_inf
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=device)
                row.index_add_(0, ids, torch.tensor(list(p.logit_bias.values()), dtype=row.dtype, device=device))
        self._penalties(logits, rows, requests, states)

    @staticmethod
    def _penalties(logits, rows, requests, states) -> None:
        """vLLM's apply_penalties over the seen tokens of every penalized row, in one gather / scatter."""
        pen = [(i, st) for i, st in zip(rows, states) if st.penalized and st.seen_ids]
        if not pen:
            return
        device = logits.device
        sizes = [len(st.seen_ids) for _, st in pen]
        params = [requests[i].sampling_params for i, _ in pen]
        repeats = torch.tensor(sizes, device=device)
        per_row = lambda values: torch.tensor(values, device=device).repeat_interleave(repeats)
        row_idx = per_row([i for i, _ in pen])
        token_idx = torch.tensor([t for _, st in pen for t in st.seen_ids], device=device)
        counts = torch.tensor([c for _, st in pen for c in st.seen_counts], device=device)
        rep = per_row([p.repetition_penalty for p in params]).to(logits.dtype)
        values = logits[row_idx, token_idx]
        values = torch.where(values > 0, values / rep, values * rep)  # every seen token (prompt or output)
        values -= per_row([p.frequency_penalty for p in params]) * counts
        values -= per_row([p.presence_penalty for p in params]) * (counts > 0).to(values.dtype)
        logits[row_idx, token_idx] = values
