"""The prefix cache's block-access stream, for what-if analyses (experiments.kv_whatif).

Three kinds of event, in the order they happen:

    lookup   a request's first scheduling: its id, prompt length, and the chained hashes of the prompt
             blocks a prefix hit could cover (KVCacheManager.get_computed_blocks), first block first;
             placed where the lookup was made (`mark`), before the blocks its allocation then cached
    cache    a block was registered under its hash (it became hittable)
    release  a block joined the free queue (its last holder let go), hash or None for a block holding no
             full prefix; in queue order, so with LRU eviction the stream fixes the eviction order

Off unless a recorder asks for it (`KVCacheManager.start_access_log`): the hot paths then pay one
attribute test per block event.
"""

from __future__ import annotations

LOOKUP, CACHE, RELEASE = "lookup", "cache", "release"


class KVAccessLog:
    def __init__(self) -> None:
        self._blocks: list[tuple] = []  # cache and release events: (kind, None, None, hashes tuple)
        self._lookups: list[tuple] = []  # (position in _blocks, (LOOKUP, request id, prompt tokens, hashes))
        self._mark = 0

    def mark(self) -> None:
        """A prefix lookup is being made now (the scheduler records it once its allocation succeeded)."""
        self._mark = len(self._blocks)

    def lookup(self, request_id: str, num_tokens: int, hashes) -> None:
        self._lookups.append((self._mark, (LOOKUP, request_id, num_tokens, tuple(hashes))))

    @property
    def events(self) -> list[tuple]:
        """Every event in stream order: (kind, request id | None, prompt tokens | None, hashes tuple)."""
        out, i = [], 0
        for pos, event in self._lookups:
            out.extend(self._blocks[i:pos])
            i = max(i, pos)
            out.append(event)
        out.extend(self._blocks[i:])
        return out

    def cache(self, block_hash: int) -> None:
        self._blocks.append((CACHE, None, None, (block_hash,)))

    def release(self, block_hash: int | None) -> None:
        self._blocks.append((RELEASE, None, None, () if block_hash is None else (block_hash,)))
