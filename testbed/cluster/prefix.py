"""The block hashes a router sees: the same chained hashes the engine's prefix cache uses."""

from testbed.core.kv_cache_manager import hash_block


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
