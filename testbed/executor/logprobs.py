"""Logprobs in vLLM's shape: per position a dict {token id: Logprob}, the scored token first, then the
k most likely tokens (vllm/v1/sample/sampler.py gather_logprobs; vllm/sequence.py Logprob)."""

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token; ties share the worse rank, as in vLLM
    decoded_token: str | None = None  # filled by whoever detokenizes (the server does), else None


def logprob_entries(logprobs: torch.Tensor, token_ids: torch.Tensor, ks: list[int]) -> list[dict[int, Logprob]]:
    """logprobs [n, vocab] (log-softmax rows), token_ids [n]: the token each row scores, ks: how many
    top tokens each row adds. vLLM's rank = how many tokens have a logprob >= the scored token's."""
    chosen_rows = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs >= chosen_rows).sum(dim=-1).tolist()
    chosen, tokens = chosen_rows.squeeze(1).tolist(), token_ids.tolist()
    k_max = max(ks, default=0)
    top_lps: list[list[float]] = []
    top_ids: list[list[int]] = []
    if k_max:
        top_values, top_indices = logprobs.topk(k_max, dim=-1)
        top_lps, top_ids = top_values.tolist(), top_indices.tolist()
    entries = []
    for i, k in enumerate(ks):
        entry = {tokens[i]: Logprob(chosen[i], ranks[i])}
        for j in range(k):
            entry.setdefault(top_ids[i][j], Logprob(top_lps[i][j], j + 1))
        entries.append(entry)
    return entries
