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

from bisect import bisect_left

LOOKUP, CACHE, RELEASE = "lookup", "cache", "release"


class KVAccessLog:
    def __init__(self) -> None:
        # cache and release events, column by column: kind, and the block's hash (None: a release of a
        # block holding no full prefix)
        self._kinds: list[str] = []
        self._hashes: list[int | None] = []
        self._lookups: list[tuple] = []  # (position in the block events, (LOOKUP, request id, prompt tokens, hashes))
        self._mark = 0

    def mark(self) -> None:
        """A prefix lookup is being made now (the scheduler records it once its allocation succeeded)."""
        self._mark = len(self._kinds)

    def lookup(self, request_id: str, num_tokens: int, hashes) -> None:
        self._lookups.append((self._mark, (LOOKUP, request_id, num_tokens, tuple(hashes))))

    def cache(self, block_hash: int) -> None:
        self._kinds.append(CACHE)
        self._hashes.append(block_hash)

    def release(self, block_hash: int | None) -> None:
        self._kinds.append(RELEASE)
        self._hashes.append(block_hash)

    def cache_all(self, block_hashes: list[int]) -> None:
        """cache(h) for each, in order."""
        self._kinds += [CACHE] * len(block_hashes)
        self._hashes += block_hashes

    def release_all(self, block_hashes: list[int | None]) -> None:
        """release(h) for each, in order."""
        self._kinds += [RELEASE] * len(block_hashes)
        self._hashes += block_hashes

    @property
    def events(self) -> list[tuple]:
        """Every event in stream order: (kind, request id | None, prompt tokens | None, hashes tuple)."""
        kinds, request_ids, num_tokens, hashes = self.columns()
        return list(zip(kinds, request_ids, num_tokens, map(tuple, hashes)))

    def columns(self) -> tuple[list, list, list, list[list[int]]]:
        """The events in stream order as columns: kinds, request ids, prompt tokens, hash lists."""
        kinds, request_ids, num_tokens, values, counts = self.flat_columns()
        hashes: list[list[int]] = []
        at = 0
        for count in counts:
            hashes.append(values[at : at + count])
            at += count
        return kinds, request_ids, num_tokens, hashes

    def flat_columns(self) -> tuple[list, list, list, list[int], list[int]]:
        """columns() with the hash lists laid end to end (no list per event): kinds, request ids, prompt
        tokens, every event's hashes one after the other, and how many each event has (a block event 1, or 0
        for a release of no full prefix: rare, found by list.index)."""
        kinds: list[str] = []
        request_ids: list[str | None] = []
        num_tokens: list[int | None] = []
        values: list = []
        counts: list[int] = []
        block_counts = [1] * len(self._hashes)
        nones: list[int] = []  # where the releases of no full prefix are
        at = -1
        while True:
            try:
                at = self._hashes.index(None, at + 1)
            except ValueError:
                break
            block_counts[at] = 0
            nones.append(at)
        block_values = [h for h in self._hashes if h is not None] if nones else self._hashes

        def blocks(start: int, end: int) -> None:
            kinds.extend(self._kinds[start:end])
            request_ids.extend([None] * (end - start))
            num_tokens.extend([None] * (end - start))
            # block events before `start` hold start - (Nones before it) values
            values.extend(block_values[start - bisect_left(nones, start) : end - bisect_left(nones, end)])
            counts.extend(block_counts[start:end])

        i = 0
        for position, (kind, request_id, n, lookup_hashes) in self._lookups:
            if position > i:
                blocks(i, position)
                i = position
            kinds.append(kind)
            request_ids.append(request_id)
            num_tokens.append(n)
            values.extend(lookup_hashes)
            counts.append(len(lookup_hashes))
        blocks(i, len(self._kinds))
        return kinds, request_ids, num_tokens, values, counts
