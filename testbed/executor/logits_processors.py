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
is dropped when the request finishes (`forget`).
"""

from dataclasses import dataclass

import torch

from testbed.sampling_params import SamplingParamError, SamplingParams


@dataclass
class _RequestState:
    output_counts: torch.Tensor | None = None  # [vocab] float: how often each token was generated
    num_counted: int = 0  # output tokens already in output_counts
    prompt_mask: torch.Tensor | None = None  # [vocab] bool: tokens of the prompt (repetition penalty)
    bad_words: list[list[int]] | None = None  # token sequences (bad_words tokenized + bad_words_token_ids)


def tokenize_bad_words(tokenizer, words: list[str]) -> list[list[int]]:
    """vLLM's SamplingParams.update_from_tokenizer: each word as it would start the text and, when that
    gives a different first token of the same length, as it would follow a space."""
    sequences = []
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
            if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
                st.output_counts = torch.zeros(self.vocab_size, device=device)
            if p.repetition_penalty != 1.0:
                prompt = torch.tensor(request.prompt_token_ids, dtype=torch.long, device=device)
                st.prompt_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=device)
                st.prompt_mask[prompt] = True
            if p.bad_words or p.bad_words_token_ids:
                words = tokenize_bad_words(self.tokenizer, p.bad_words) if p.bad_words else []
                st.bad_words = words + p.bad_words_token_ids
        if st.output_counts is not None and st.num_counted < len(request.output_token_ids):
            new = request.output_token_ids[st.num_counted :]
            ids = torch.tensor(new, dtype=torch.long, device=st.output_counts.device)
            st.output_counts.index_add_(0, ids, torch.ones(len(new), device=st.output_counts.device))
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
        """vLLM's apply_penalties over the rows with a penalty, batched."""
        pen = [(i, st) for i, st in zip(rows, states) if st.output_counts is not None]
        if not pen:
            return
        idx = torch.tensor([i for i, _ in pen], dtype=torch.long, device=logits.device)
        params = [requests[i].sampling_params for i, _ in pen]
        counts = torch.stack([st.output_counts for _, st in pen])
        sub = logits[idx]
        rep = torch.tensor([p.repetition_penalty for p in params], device=logits.device).unsqueeze(1)
        if (rep != 1.0).any():
            zeros = torch.zeros_like(counts, dtype=torch.bool)
            seen = torch.stack([st.prompt_mask if st.prompt_mask is not None else zeros[0] for _, st in pen])
            seen |= counts > 0
            factor = torch.where(seen, rep, torch.ones_like(rep))
            sub = torch.where(sub > 0, sub / factor, sub * factor)
        freq = torch.tensor([p.frequency_penalty for p in params], device=logits.device).unsqueeze(1)
        pres = torch.tensor([p.presence_penalty for p in params], device=logits.device).unsqueeze(1)
        sub = sub - freq * counts - pres * (counts > 0).to(sub.dtype)
        logits[idx] = sub
