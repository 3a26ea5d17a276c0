"""Azure LLM inference trace loader: own fixtures, shipped sample, real file when present."""

import pandas as pd
import pytest

from experiments.traces import PROJECT_ROOT, TraceError, load_trace

V, M = 32000, 16384


def load(path, **kw):
    return load_trace({"name": "azure", "path": str(path), **kw}, vocab_size=V, max_model_len=M)


def test_fixture_counts_lengths_arrivals(fixtures):
    tr = load(fixtures / "azure_small.csv")
    assert len(tr) == 6 and tr.report["rows_read"] == 6 and tr.report["rows_in_file"] == 6
    assert [r.prompt_len for r in tr] == [374, 396, 879, 91, 4000, 12]
    assert [r.max_tokens for r in tr] == [44, 109, 55, 16, 500, 1]
    assert [r.arrival_s for r in tr] == pytest.approx([0, 4.314579, 4.541877, 4.710427, 14.31941, 23.81941])
    assert all(r.ignore_eos and r.priority == 0 for r in tr)
    assert tr[1].meta == {"line": 3, "prompt_len": 396, "output_len": 109}
    assert len({r.request_id for r in tr}) == 6


def test_token_ids_in_safe_range_and_deterministic(fixtures):
    a, b = load(fixtures / "azure_small.csv"), load(fixtures / "azure_small.csv")
    ids = [t for r in a for t in r.prompt_token_ids]
    assert min(ids) >= 100 and max(ids) < V
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    c = load(fixtures / "azure_small.csv", seed=1)
    assert a[0].prompt_token_ids != c[0].prompt_token_ids
    assert a[0].prompt_token_ids[:50] != a[1].prompt_token_ids[:50]  # no accidental sharing


def test_2024_timestamps_with_timezone(fixtures):
    tr = load(fixtures / "azure_2024_small.csv")
    assert [r.arrival_s for r in tr] == pytest.approx([0, 0.49007, 2.24007])
    assert [r.prompt_len for r in tr] == [1631, 4462, 213]


def test_shipped_sample_via_relative_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # Hydra may run from an output dir: path resolves to the project root
    tr = load("experiments/data/azure_llm_2023_conv_sample.csv")
    df = pd.read_csv(PROJECT_ROOT / "experiments/data/azure_llm_2023_conv_sample.csv")
    assert len(tr) == 1000 == len(df)
    assert [r.prompt_len for r in tr] == df.ContextTokens.tolist()
    assert [r.max_tokens for r in tr] == df.GeneratedTokens.tolist()
    assert tr[0].arrival_s == 0 and tr[-1].arrival_s == pytest.approx(216.027393)


def test_real_trace(shared):
    tr = load(shared / "azure_llm_2023_conv.csv", max_requests=None)
    df = pd.read_csv(shared / "azure_llm_2023_conv.csv")
    assert len(tr) == len(df) == 19366
    assert sum(r.prompt_len for r in tr) == df.ContextTokens.sum()  # max len 14050 + 1000 < M
    assert sum(r.max_tokens for r in tr) == df.GeneratedTokens.sum()
    assert tr[-1].arrival_s == pytest.approx(3501.721937)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(tr.requests, tr.requests[1:]))


def test_real_trace_window_and_time_scale(shared):
    path = shared / "azure_llm_2023_conv.csv"
    full = load(path, window=[600, 1200])
    t = pd.to_datetime(pd.read_csv(path).TIMESTAMP)
    rel = (t - t.iloc[0]).dt.total_seconds()
    assert len(full) == int(((rel >= 600) & (rel < 1200)).sum())
    assert full.report["rebase_offset_s"] == 600 and full.report["stopped_at"] == "window_end"
    assert all(0 <= r.arrival_s < 600 for r in full)
    fast = load(path, window=[600, 1200], time_scale=4.0)
    assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 4 for r in full])


def test_start_and_max_requests(fixtures):
    tr = load(fixtures / "azure_small.csv", start=2, max_requests=3)
    assert [r.prompt_len for r in tr] == [879, 91, 4000]
    assert tr[0].arrival_s == 0  # rebased to the first selected request
    assert tr.report["skipped"]["before_start"] == 2 and tr.report["stopped_at"] == "max_requests"
    raw = load(fixtures / "azure_small.csv", start=2, rebase=False)
    assert raw[0].arrival_s == pytest.approx(4.541877)


@pytest.mark.parametrize(
    "text, line, field",
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", 1, "GeneratedTokens"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:47,x,4\n",
            3,
            "ContextTokens",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,-4\n", 2, "GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3.5,4\n", 2, "ContextTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\nyesterday,3,4\n", 3, "TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,\n", 2, "GeneratedTokens"),
    ],
)
def test_bad_rows_name_file_line_field(write, text, line, field):
    p = write("bad.csv", text)
    with pytest.raises(TraceError) as e:
        load(p)
    assert e.value.line == line and e.value.field == field
    assert str(p) in str(e.value) and f"line {line}" in str(e.value) and field in str(e.value)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("", "empty file"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no data rows"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4,9,9\n", "malformed CSV"),
    ],
)
def test_empty_or_malformed_file(write, text, msg):
    with pytest.raises(TraceError, match=msg):
        load(write("bad.csv", text))


def test_missing_file_and_no_path(tmp_path):
    with pytest.raises(TraceError, match="file not found"):
        load(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="no path"):
        load_trace({"name": "azure"}, vocab_size=V, max_model_len=M)
    assert isinstance(TraceError("x"), ValueError)
