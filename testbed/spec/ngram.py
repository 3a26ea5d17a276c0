"""Prompt lookup: match the last n tokens (n from prompt_lookup_max down to prompt_lookup_min) earlier
in the prompt and output so far; propose the k tokens that followed the most recent match with k
tokens after it (or the earliest match, whose continuation is the longest)."""

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from testbed.spec.base import Proposer


def ngram_propose(tokens, k: int, n_max: int, n_min: int) -> list[int]:
    arr = np.asarray(tokens, dtype=np.int64)
    size = len(arr)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = arr[size - n :]
        # windows starting at 0 .. size-n-1: any match that is not the suffix itself
        windows = sliding_window_view(arr[: size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            # the most recent match that still has k tokens after it (else the earliest, which has the most)
            full = hits[hits <= size - n - k]
            start = int(full[-1] if len(full) else hits[0]) + n
            return arr[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    name = "ngram"

    @classmethod
    def build(cls, config, ctx) -> "NgramProposer":
        return cls(config.prompt_lookup_max, config.prompt_lookup_min)

    def __init__(self, n_max: int, n_min: int):
        self.n_max, self.n_min = n_max, n_min

    def propose(self, requests, num_tokens):
        return [(ngram_propose(r.all_token_ids, k, self.n_max, self.n_min), None) for r, k in zip(requests, num_tokens)]
