"""Mooncake JSONL loader: arrivals, lengths and hash-id-shared prompt blocks."""

import json

import pytest

from experiments.traces import TraceError, load_trace

V = 32000


def load(path, max_model_len=1 << 20, **kw):
    return load_trace({"name": "mooncake", "path": str(path), **kw}, vocab_size=V, max_model_len=max_model_len)


def assert_blocks_shared(tr, bs):
    """Equal hash ids carry the same tokens (a shorter, clipped or partial block is a prefix of
    the longest one seen); different ids carry different content."""
    seen = {}
    for r in tr:
        for j, h in enumerate(r.meta["hash_ids"]):
            block = r.prompt_token_ids[j * bs : (j + 1) * bs]
            if not block:
                break
            ref = seen.setdefault(h, block)
            n = min(len(ref), len(block))
            assert ref[:n] == block[:n], (r.request_id, h)
            if len(block) > len(ref):
                seen[h] = block
    heads = {tuple(b[:8]) for b in seen.values() if len(b) >= 8}
    assert len(heads) == sum(len(b) >= 8 for b in seen.values())
    return seen


def test_fixture_arrivals_lengths_blocks(fixtures):
    tr = load(fixtures / "mooncake_small.jsonl", block_size=4)
    assert len(tr) == 5 and tr.report["rows_in_file"] == 5  # trailing blank line is not a row
    assert [r.arrival_s for r in tr] == [0, 0, 1.5, 2.75, 4.0]
    assert [r.prompt_len for r in tr] == [10, 9, 6, 10, 12]
    assert [r.max_tokens for r in tr] == [3, 2, 4, 1, 5]
    assert tr[0].meta["hash_ids"] == [0, 1, 2] and tr[0].meta["line"] == 1
    p = [r.prompt_token_ids for r in tr]
    assert p[0] == p[3]  # same ids, same length -> identical prompts
    assert p[0][:8] == p[1][:8]  # shared blocks 0, 1
    assert p[0][8] != p[1][8]  # block 2 vs block 3 differ
    assert p[0][:4] != p[2][:4]  # block 0 vs block 4 differ
    assert tr.report["hash_len_mismatch"] == 1  # row 5: 12 tokens, one 4-token id
    assert_blocks_shared(tr, 4)
    assert all(100 <= t < V for ids in p for t in ids)


def test_partial_last_block_is_prefix_of_full_block(write):
    rows = [
        {"timestamp": 0, "input_length": 7, "output_length": 1, "hash_ids": [5, 9]},
        {"timestamp": 1, "input_length": 8, "output_length": 1, "hash_ids": [5, 9]},
    ]
    p = write("t.jsonl", "\n".join(json.dumps(r) for r in rows))
    a, b = load(p, block_size=4)
    assert a.prompt_token_ids == b.prompt_token_ids[:7]


def test_block_size_and_seed_change_content(fixtures):
    a = load(fixtures / "mooncake_small.jsonl", block_size=4)
    b = load(fixtures / "mooncake_small.jsonl", block_size=4, seed=7)
    assert a[0].prompt_token_ids != b[0].prompt_token_ids
    assert b[0].prompt_token_ids == b[3].prompt_token_ids


def test_clip_keeps_shared_prefix(fixtures):
    tr = load(fixtures / "mooncake_small.jsonl", block_size=4, max_model_len=8)
    full = load(fixtures / "mooncake_small.jsonl", block_size=4)
    for c, f in zip(tr, full):
        assert c.prompt_len + c.max_tokens <= 8
        assert c.prompt_token_ids == f.prompt_token_ids[: c.prompt_len]
    assert tr.report["clipped"]["overlength"] == 5


def test_shipped_sample_shares_blocks():
    tr = load("experiments/data/mooncake_fast25_synthetic_sample.jsonl", max_model_len=1 << 20, max_requests=60)
    assert len(tr) == 60 and tr[0].prompt_len == 40160
    seen = assert_blocks_shared(tr, 512)
    assert sum(1 for r in tr for h in r.meta["hash_ids"]) > len(seen)  # the sample does reuse ids


def test_real_trace(shared):
    path = shared / "mooncake_fast25_synthetic.jsonl"
    tr = load(path, max_model_len=4096)
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    assert len(tr) == len(rows) == 3993
    assert tr[-1].arrival_s == pytest.approx(rows[-1]["timestamp"] / 1000) == pytest.approx(1022.025)
    assert [r.meta["prompt_len"] for r in tr] == [r["input_length"] for r in rows]
    over = sum(r["input_length"] + r["output_length"] > 4096 for r in rows)
    assert tr.report["clipped"]["overlength"] == over > 0
    assert all(r.prompt_len + r.max_tokens <= 4096 for r in tr)
    assert_blocks_shared(tr, 512)


def test_time_scale_and_window(fixtures):
    tr = load(fixtures / "mooncake_small.jsonl", block_size=4, time_scale=2.0, window=[1.0, 3.0])
    assert [r.arrival_s for r in tr] == [0.25, 0.875]  # (1.5-1)/2, (2.75-1)/2
    assert tr.report["skipped"]["before_window"] == 2 and tr.report["stopped_at"] == "window_end"


@pytest.mark.parametrize(
    "line, field",
    [
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]', None),
        ("[1, 2]", None),
        ('{"timestamp": 0, "output_length": 1, "hash_ids": [0]}', "input_length"),
        ('{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [0]}', "timestamp"),
        ('{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [0]}', "input_length"),
        ('{"timestamp": 0, "input_length": 5.5, "output_length": 1, "hash_ids": [0]}', "input_length"),
        ('{"timestamp": 0, "input_length": 5, "output_length": true, "hash_ids": [0]}', "output_length"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "0,1"}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "hash_ids"),
    ],
)
def test_bad_lines(write, line, field):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}'
    p = write("bad.jsonl", good + "\n" + line + "\n")
    with pytest.raises(TraceError) as e:
        load(p)
    assert e.value.line == 2 and e.value.field == field and str(p) in str(e.value)


def test_empty_and_missing(write, tmp_path):
    with pytest.raises(TraceError, match="no records"):
        load(write("e.jsonl", "\n\n"))
    with pytest.raises(TraceError, match="file not found"):
        load(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="block_size"):
        load(write("x.jsonl", "{}"), block_size=0)
