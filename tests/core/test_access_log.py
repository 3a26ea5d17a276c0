"""The block-access stream's columns: events in order, lookups placed where they were marked, a release of
a block holding no full prefix as an empty hash list (first, between, last)."""

from testbed.core.access_log import KVAccessLog


def test_columns_in_stream_order():
    log = KVAccessLog()
    log.release(None)
    log.mark()
    log.cache(11)
    log.lookup("a", 40, [5, 6])  # recorded after its allocation cached 11, placed where it was marked
    log.cache_all([12, 13])
    log.release_all([13, None, 12])
    log.mark()
    log.lookup("b", 20, [])
    log.release(None)
    kinds, request_ids, num_tokens, hashes = log.columns()
    assert kinds == ["release", "lookup", *["cache"] * 3, *["release"] * 3, "lookup", "release"]
    assert request_ids == [None, "a", None, None, None, None, None, None, "b", None]
    assert num_tokens == [None, 40, None, None, None, None, None, None, 20, None]
    assert hashes == [[], [5, 6], [11], [12], [13], [13], [], [12], [], []]
    assert len({id(h) for h in hashes}) == len(hashes)  # each row its own list
    assert log.events[1] == ("lookup", "a", 40, (5, 6))
