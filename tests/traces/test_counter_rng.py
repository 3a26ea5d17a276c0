"""Synthesised prompt tokens: the batched builder gives each request exactly request_tokens' ids, whatever
the chunking (a chunk may hold many requests, one, or stop inside none), as lists of plain ints."""

import numpy as np
import pytest

from experiments.traces.counter_rng import batch_request_tokens, request_tokens


@pytest.mark.parametrize("chunk_tokens", [1, 7, 300, 1 << 16, 1 << 22])
def test_batches_equal_one_request_at_a_time(chunk_tokens):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 400, size=60).tolist()
    indices = rng.permutation(1000)[:60].tolist()
    batched = batch_request_tokens(11, indices, lengths, 5000, 7, chunk_tokens=chunk_tokens)
    assert len(batched) == len(lengths)
    for ids, index, n in zip(batched, indices, lengths):
        assert type(ids) is list and set(map(type, ids)) == {int}
        assert ids == request_tokens(11, index, n, 5000, 7).tolist()
