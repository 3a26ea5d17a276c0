"""Corrupt traces are refused at load time with a TraceError naming file, line and field, never replayed
as something else: lengths outside int64 (which used to wrap to INT64_MIN and replay as 1-token prompts),
absurd timestamps (beyond trace.horizon_s), binary / latin-1 / deeply nested / huge-integer JSON.
Lengths inside int64 but beyond the model's context follow trace.overlength and are counted."""

import json

import pytest

from experiments.traces import TraceError, load_trace

V, MAX_LEN = 32000, 4096
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
GOOD_MOONCAKE = '{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [0, 1]}\n'


def load(name, path, **kw):
    return load_trace({"name": name, "path": str(path), **kw}, vocab_size=V, max_model_len=MAX_LEN)


def refused(name, path, line, field, match, **kw) -> TraceError:
    with pytest.raises(TraceError, match=match) as info:
        load(name, path, **kw)
    e = info.value
    assert (str(e.path), e.line, e.field) == (str(path), line, field), str(e)
    assert str(path) in str(e)
    return e


def write_bytes(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("overlength", ["clip", "skip", "error"])
def test_azure_length_beyond_int64_is_refused_under_every_policy(write, overlength):
    p = write("a.csv", AZURE_HEAD + "2023-11-16 18:15:47.0,99999999999999999999,5\n")
    refused("azure", p, 3, "ContextTokens", "int64", overlength=overlength)


def test_azure_long_length_is_clipped_and_counted(write):
    p = write("a.csv", AZURE_HEAD + "2023-11-16 18:15:47.0,1000000000000000,5\n")
    trace = load("azure", p)
    assert [r.prompt_len for r in trace] == [374, MAX_LEN - 5]
    assert trace.report["clipped"]["overlength"] == 1
    assert trace.report["clipped"]["prompt_tokens"] == 10**15 - (MAX_LEN - 5)
    with pytest.raises(TraceError, match="overlength=error") as info:
        load("azure", p, overlength="error")
    assert info.value.line == 3


def test_azure_absurd_timestamp_is_refused(write):
    p = write("a.csv", AZURE_HEAD + "2200-01-01 00:00:00.0,10,5\n")
    e = refused("azure", p, 3, "TIMESTAMP", "horizon_s")
    assert "line 2" in str(e)  # names the earliest row too
    assert len(load("azure", p, horizon_s=None)) == 2  # a longer horizon is a config choice


def test_burstgpt_absurd_timestamp_and_huge_length(write):
    head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,x\n"
    refused("burstgpt", write("b.csv", head + "1e308,ChatGPT,10,5,15,x\n"), 3, "Timestamp", "horizon_s")
    refused("burstgpt", write("c.csv", head + "6,ChatGPT,10,1e20,15,x\n"), 3, "Response tokens", "int64")


@pytest.mark.parametrize(
    "line, field, match",
    [
        (
            '{"timestamp": 1, "input_length": 100000000000000000000, "output_length": 3, "hash_ids": []}',
            "input_length",
            "int64",
        ),
        ('{"timestamp": 1e308, "input_length": 10, "output_length": 3, "hash_ids": [0]}', "timestamp", "horizon_s"),
        (
            '{"timestamp": 1, "input_length": 10, "output_length": 3, "hash_ids": [100000000000000000000]}',
            "hash_ids",
            "int64",
        ),
        (
            '{"timestamp": ' + "9" * 400 + ', "input_length": 10, "output_length": 3, "hash_ids": [0]}',
            "timestamp",
            "int64",
        ),
    ],
    ids=["length", "timestamp", "hash_id", "timestamp_int"],
)
def test_mooncake_values_out_of_range(write, line, field, match):
    refused("mooncake", write("m.jsonl", GOOD_MOONCAKE + line + "\n"), 2, field, match)


@pytest.mark.parametrize(
    "payload, match",
    [
        (bytes(range(128, 256)) * 4, "not UTF-8"),  # a binary file
        ('{"timestamp": 1, "note": "café"}'.encode("latin-1"), "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"timestamp": ' + b"1" * 5000 + b"}", "unreadable JSON value"),
        (b'{"timestamp": 1, ', "malformed JSON"),
    ],
    ids=["binary", "latin1", "deep", "huge_int", "truncated"],
)
def test_mooncake_unreadable_lines_name_their_line(tmp_path, payload, match):
    p = write_bytes(tmp_path, "m.jsonl", GOOD_MOONCAKE.encode() + payload + b"\n")
    e = refused("mooncake", p, 2, None, match)
    assert e.__cause__ is None and e.__suppress_context__  # no raw decoder traceback chained


@pytest.mark.parametrize(
    "payload, match",
    [(b"[" * 100_000 + b"]" * 100_000, "nested too deeply"), (b"[" + b"7" * 5000 + b"]", "unreadable JSON value")],
    ids=["deep", "huge_int"],
)
def test_sharegpt_unreadable_json(tmp_path, tok, payload, match):
    p = write_bytes(tmp_path, "s.json", payload)
    with pytest.raises(TraceError, match=match) as info:
        load_trace({"name": "sharegpt", "path": str(p)}, vocab_size=V, max_model_len=MAX_LEN, tokenizer=tok)
    assert str(p) in str(info.value)


def test_synthetic_lengths_and_rate_out_of_range():
    base = {"name": "synthetic", "num_requests": 4}
    with pytest.raises(TraceError, match="int64") as info:
        load_trace({**base, "prompt_len": {"dist": "fixed", "value": 1e30}}, vocab_size=V, max_model_len=MAX_LEN)
    assert info.value.field == "prompt_len"
    with pytest.raises(TraceError, match="horizon_s") as info:
        load_trace({**base, "rate": 1e-12}, vocab_size=V, max_model_len=MAX_LEN)
    assert info.value.field == "rate"


@pytest.mark.parametrize("bad", [0, -1, "1d", True, float("inf")])
def test_horizon_option_is_checked(write, bad):
    with pytest.raises(TraceError, match="horizon_s"):
        load("mooncake", write("m.jsonl", GOOD_MOONCAKE), horizon_s=bad)


def test_a_normal_trace_still_loads(write):
    rows = [{"timestamp": 1000 * i, "input_length": 10, "output_length": 3, "hash_ids": [i]} for i in range(3)]
    trace = load("mooncake", write("m.jsonl", "\n".join(json.dumps(r) for r in rows)))
    assert [r.arrival_s for r in trace] == [0.0, 1.0, 2.0]
