"""The prefix cache's block-access stream, for what-if analyses (experiments.kv_whatif).

Three kinds of event, in the order they happen:

    lookup   a request's first scheduling: its id, prompt length, and the chained hashes of the prompt
             blocks a prefix hit could cover (PagedAllocator.get_computed_blocks), first block first;
             placed where the lookup was made (`mark`), before the blocks its allocation then cached
    cache    a block was registered under its hash (it became hittable)
    release  a block joined the free queue (its last holder let go), hash or None for a block holding no
             full prefix; in queue order, so with LRU eviction the stream fixes the eviction order

Off unless a recorder asks for it (`PagedAllocator.start_access_log`): the hot paths then pay one
attribute test per block event.
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import is_not

import numpy as np

LOOKUP, CACHE, RELEASE = "lookup", "cache", "release"
KINDS = (LOOKUP, CACHE, RELEASE)  # each kind's code: its index here
_CACHE_CODE, _RELEASE_CODE = b"\x01", b"\x02"


class KVAccessLog:
    def __init__(self) -> None:
        # cache and release events, column by column: kind (its code in KINDS, a byte each), and the
        # block's hash (None: a release of a block holding no full prefix)
        self._codes = bytearray()
        self._hashes: list[int | None] = []
        self._lookups: list[tuple] = []  # (position in the block events, (LOOKUP, request id, prompt tokens, hashes))
        self._mark = 0

    def mark(self) -> None:
        """A prefix lookup is being made now (the scheduler records it once its allocation succeeded)."""
        self._mark = len(self._codes)

    def lookup(self, request_id: str, num_tokens: int, hashes) -> None:
        self._lookups.append((self._mark, (LOOKUP, request_id, num_tokens, tuple(hashes))))

    def cache(self, block_hash: int) -> None:
        self._codes += _CACHE_CODE
        self._hashes.append(block_hash)

    def release(self, block_hash: int | None) -> None:
        self._codes += _RELEASE_CODE
        self._hashes.append(block_hash)

    def cache_all(self, block_hashes: list[int]) -> None:
        """cache(h) for each, in order."""
        self._codes += _CACHE_CODE * len(block_hashes)
        self._hashes += block_hashes

    def release_all(self, block_hashes: list[int | None]) -> None:
        """release(h) for each, in order."""
        self._codes += _RELEASE_CODE * len(block_hashes)
        self._hashes += block_hashes

    @property
    def events(self) -> list[tuple]:
        """Every event in stream order: (kind, request id | None, prompt tokens | None, hashes tuple)."""
        kinds, request_ids, num_tokens, hashes = self.columns()
        return list(zip(kinds, request_ids, num_tokens, map(tuple, hashes)))

    def columns(self) -> tuple[list, list, list, list[list[int]]]:
        """The events in stream order as columns: kinds, request ids, prompt tokens, hash lists (a block event's
        one hash, none for a release of no full prefix). Made event by event: the model `arrays` is held to."""
        kinds: list[str] = []
        request_ids: list[str | None] = []
        num_tokens: list[int | None] = []
        hashes: list[list[int]] = []

        def blocks(start: int, end: int) -> None:
            for code, h in zip(self._codes[start:end], self._hashes[start:end]):
                kinds.append(KINDS[code])
                request_ids.append(None)
                num_tokens.append(None)
                hashes.append([] if h is None else [h])

        i = 0
        for position, (kind, request_id, n, lookup_hashes) in self._lookups:
            blocks(i, position)
            i = position
            kinds.append(kind)
            request_ids.append(request_id)
            num_tokens.append(n)
            hashes.append(list(lookup_hashes))
        blocks(i, len(self._codes))
        return kinds, request_ids, num_tokens, hashes

    def arrays(self) -> tuple[np.ndarray, np.ndarray, list, list, np.ndarray, np.ndarray] | None:
        """columns() as arrays, made without a Python object per event: each event's kind code (int8, an index
        into KINDS), where the lookups are among the events (int64), their request ids and prompt tokens, every
        event's hashes one after the other (int64) and how many each event has (int64). None when a hash is
        not an int64 (then only columns() can say it)."""
        lookups = self._lookups
        num_blocks, num_lookups = len(self._codes), len(lookups)
        positions = np.fromiter((position for position, _ in lookups), dtype=np.int64, count=num_lookups)
        # a lookup goes before the block event at its position, after the lookups placed there before it
        lookup_at = positions + np.arange(num_lookups, dtype=np.int64)
        block_at = np.arange(num_blocks, dtype=np.int64)
        block_at += np.searchsorted(positions, block_at, side="right")
        codes = np.zeros(num_blocks + num_lookups, dtype=np.int8)  # 0: LOOKUP
        codes[block_at] = np.frombuffer(self._codes, dtype=np.int8)
        lookup_hashes = [entry[3] for _, entry in lookups]
        try:
            nones, block_values = self._block_hashes()
            lookup_values = np.fromiter(chain.from_iterable(lookup_hashes), np.int64, sum(map(len, lookup_hashes)))
        except (OverflowError, TypeError, ValueError):  # a hash that is not an int64
            return None
        counts = np.ones(num_blocks + num_lookups, dtype=np.int64)
        counts[block_at[nones]] = 0
        lookup_counts = np.fromiter(map(len, lookup_hashes), dtype=np.int64, count=num_lookups)
        counts[lookup_at] = lookup_counts
        starts = np.cumsum(counts) - counts
        values = np.empty(int(counts.sum()), dtype=np.int64)
        values[starts[np.delete(block_at, nones)]] = np.delete(block_values, nones)
        within = np.arange(len(lookup_values), dtype=np.int64)
        within -= np.repeat(np.cumsum(lookup_counts) - lookup_counts, lookup_counts)
        values[np.repeat(starts[lookup_at], lookup_counts) + within] = lookup_values
        request_ids = [entry[1] for _, entry in lookups]
        num_tokens = [entry[2] for _, entry in lookups]
        return codes, lookup_at, request_ids, num_tokens, values, counts

    def _block_hashes(self) -> tuple[np.ndarray, np.ndarray]:
        """Where the block events releasing no full prefix (hash None) are, and every block event's hash as
        int64 (0 in their place). Few (prefix caching on): found by list.index; many (off: every release), by
        one pass over all of them."""
        hashes, n = self._hashes, len(self._hashes)
        if hashes.count(None) * 16 > n:
            nones = np.flatnonzero(~np.fromiter(map(is_not, hashes, repeat(None)), dtype=bool, count=n))
            return nones, np.fromiter((0 if h is None else h for h in hashes), dtype=np.int64, count=n)
        found: list[int] = []
        at = -1
        while True:
            try:
                at = hashes.index(None, at + 1)
            except ValueError:
                break
            found.append(at)
        if found:
            hashes = hashes.copy()
            for at in found:
                hashes[at] = 0
        return np.array(found, dtype=np.int64), np.fromiter(hashes, dtype=np.int64, count=n)
