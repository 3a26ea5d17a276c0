"""Chained block hashes for prefix caching: a full block's hash covers its tokens and its parent's hash."""

# the parent of a first block: an int, because hash(None) is its address before Python 3.12, which would make
# block hashes (and so prefix-affinity routing) differ from process to process (vLLM seeds its NONE_HASH too)
ROOT_HASH = 0x5EED_CAFE


def hash_block(parent_hash: int | None, token_ids) -> int:
    """Chained block hash: equal hashes mean equal whole prefixes, not just equal blocks. Ints and tuples of
    ints hash the same in every process, so the hashes are reproducible across runs."""
    return hash((ROOT_HASH if parent_hash is None else parent_hash, *token_ids))
