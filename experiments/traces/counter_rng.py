"""Deterministic synthesis of token ids and arrival times.

Token ids come from a counter-based hash (splitmix64) of (seed, domain, key, position) rather
than a stateful RNG: a request's prompt then depends only on its own key (row index, Mooncake
hash id, prefix group), never on which other rows were selected, and it vectorises in numpy.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

MASK = (1 << 64) - 1
_G = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB

# Separate key spaces so e.g. row 7's filler never equals hash block 7.
DOMAIN_REQUEST = 1
DOMAIN_BLOCK = 2
DOMAIN_PREFIX = 3


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, in place on a fresh uint64 array (tens of millions of tokens:
    temporaries matter). uint64 array arithmetic wraps silently, as wanted."""
    t = np.empty_like(x)
    for shift, mul in ((30, _M1), (27, _M2)):
        np.right_shift(x, np.uint64(shift), out=t)
        x ^= t
        x *= np.uint64(mul)
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def hashed_tokens(seed: int, domain: int, keys, positions, vocab_size: int, low: int, repeats=None) -> np.ndarray:
    """Token ids in [low, vocab_size), a pure function of (seed, domain, key, position).

    With `repeats`, key j covers the next repeats[j] positions (the key hash is then computed
    once per key instead of once per token).
    """
    base = np.uint64(((int(seed) & MASK) * _G + domain * _M2) & MASK)
    k = np.asarray(keys, dtype=np.int64).view(np.uint64)
    kh = _mix(base ^ (k * np.uint64(_G)))
    if repeats is not None:
        kh = np.repeat(kh, repeats)
    x = _mix(kh + np.asarray(positions, dtype=np.int64).view(np.uint64) * np.uint64(_M1))
    # Lemire's multiply-shift maps the high 32 bits onto [0, span) without a slow modulo.
    x = ((x >> np.uint64(32)) * np.uint64(vocab_size - low)) >> np.uint64(32)
    out = x.view(np.int64)
    out += low
    return out


def request_tokens(seed: int, index: int, n: int, vocab_size: int, low: int, start: int = 0) -> np.ndarray:
    """Random-looking prompt tokens owned by one request (no sharing with other requests)."""
    return hashed_tokens(seed, DOMAIN_REQUEST, [index], np.arange(start, start + n), vocab_size, low, repeats=n)


@lru_cache(maxsize=4)
def _int_objects(vocab_size: int) -> np.ndarray:
    return np.array(list(range(vocab_size)), dtype=object)


def id_list(ids: np.ndarray, vocab_size: int) -> list[int]:
    """ids -> list[int] sharing one int object per id value: ~5x less memory than .tolist()
    (a long trace holds tens of millions of prompt tokens) and faster to build."""
    return _int_objects(vocab_size)[ids].tolist()


class BlockTokens:
    """Prompts made of hash-identified blocks (Mooncake), with blocks cached per load.

    Block content depends only on (seed, hash id, offset in block): equal ids give identical
    blocks, and a partial last block is the prefix of its id's block (in the Mooncake traces a
    partial-block id is only ever shared by prompts with the same partial length). Positions
    beyond the listed ids are filled with tokens owned by the request.
    """

    def __init__(self, seed: int, block_size: int, vocab_size: int, low: int):
        self.seed, self.bs, self.vocab, self.low = seed, block_size, vocab_size, low
        self.cache: dict[int, list[int]] = {}

    def build(self, hash_ids, n: int, index: int) -> list[int]:
        bs = self.bs
        need = list(hash_ids[: -(-n // bs)])
        missing = [h for h in dict.fromkeys(need) if h not in self.cache]
        if missing:  # one vectorised call per request, not per block
            pos = np.tile(np.arange(bs), len(missing))
            ids = hashed_tokens(self.seed, DOMAIN_BLOCK, missing, pos, self.vocab, self.low, repeats=bs)
            flat = id_list(ids, self.vocab)
            for j, h in enumerate(missing):
                self.cache[h] = flat[j * bs : (j + 1) * bs]
        out: list[int] = []
        for h in need:
            out.extend(self.cache[h])
        del out[n:]
        if len(out) < n:
            rest = request_tokens(self.seed, index, n - len(out), self.vocab, self.low, start=len(out))
            out.extend(id_list(rest, self.vocab))
        return out


def prefix_tokens(seed: int, group: int, n: int, vocab_size: int, low: int) -> np.ndarray:
    """A shared system prompt: identical for every request of the group."""
    return hashed_tokens(seed, DOMAIN_PREFIX, [group], np.arange(n), vocab_size, low, repeats=n)


def inter_arrivals(rng: np.random.Generator, n: int, rate, burstiness: float = 1.0) -> np.ndarray:
    """n gaps with mean 1/rate; gamma shape = burstiness (1 = Poisson, <1 burstier).

    rate None / 0 / inf means everything arrives at once (all gaps 0).
    """
    if rate is None or rate == 0 or np.isinf(rate):
        return np.zeros(n)
    if rate < 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be > 0, got rate={rate}, burstiness={burstiness}")
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrival_times(rng: np.random.Generator, n: int, rate, burstiness: float = 1.0) -> np.ndarray:
    """Arrival times starting at 0 (the first request does not wait a gap)."""
    gaps = inter_arrivals(rng, n, rate, burstiness)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else np.zeros(0)


def batch_request_tokens(
    seed: int, indices, lengths, vocab_size: int, low: int, chunk_tokens: int = 1 << 16
) -> list[list[int]]:
    """request_tokens for many requests in few numpy calls (per-request calls dominate otherwise). Chunks
    are small so that their arrays (512 KiB) are reused: arrays of millions of tokens take fresh memory each
    time, which numpy has the kernel back with huge pages (madvise), costly to fault in."""
    out: list[list[int]] = []
    idx, lens = np.asarray(indices, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    j = 0
    while j < len(idx):
        # Take requests until the chunk holds chunk_tokens (at least one request).
        k = j + max(1, int(np.searchsorted(np.cumsum(lens[j:]), chunk_tokens, side="right")))
        ln = lens[j:k]
        ends = np.cumsum(ln)
        pos = np.arange(ends[-1]) - np.repeat(ends - ln, ln)
        flat = _int_objects(vocab_size)[hashed_tokens(seed, DOMAIN_REQUEST, idx[j:k], pos, vocab_size, low, repeats=ln)]
        out.extend(a.tolist() for a in np.split(flat, ends[:-1]))
        j = k
    return out
