"""The block hashes a router sees: the same chained hashes the engine's prefix cache uses."""

from testbed.core.allocators.paged import hash_block


def leading_block_hashes(prompt_token_ids, block_size: int, max_blocks: int | None = None) -> list[int]:
    """Chained hashes of the prompt's full blocks that a prefix hit could cover (at least one token is
    always computed, so the last token is left out), at most max_blocks of them."""
    n = (len(prompt_token_ids) - 1) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    hashes, parent = [], None
    for i in range(n):
        parent = hash_block(parent, prompt_token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


class RoutedPrefixes:
    """Where a router cannot read a replica's prefix cache (replica processes, HTTP backends): the block
    hashes of the prompts it sent there, least recently sent forgotten first beyond `capacity` blocks.
    An approximation of the cache, as SGLang's router keeps an approximate radix tree per worker."""

    def __init__(self, capacity: int):
        from collections import OrderedDict

        self.capacity = max(1, capacity)
        self.hashes: OrderedDict[int, None] = OrderedDict()

    def add(self, block_hashes) -> None:
        for h in block_hashes:
            self.hashes[h] = None
            self.hashes.move_to_end(h)
        while len(self.hashes) > self.capacity:
            self.hashes.popitem(last=False)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.hashes


def text_block_hashes(text: str, block_chars: int = 64) -> list[int]:
    """Chained hashes of a text prompt's full `block_chars`-character blocks: a router in front of HTTP
    backends sees text, not token ids (SGLang's router matches prefixes on text for the same reason).
    Python's str hash differs between processes: they mean something only in the router that made them."""
    hashes, parent = [], None
    for i in range(len(text) // block_chars):
        parent = hash((parent, text[i * block_chars : (i + 1) * block_chars]))
        hashes.append(parent)
    return hashes
