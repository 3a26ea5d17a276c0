"""BurstGPT CSV loader: filters, failed (0-token) responses, optional session columns."""

import pytest

from experiments.traces import TraceError, load_trace

V, M = 32000, 8192


def load(path, **kw):
    return load_trace({"name": "burstgpt", "path": str(path), **kw}, vocab_size=V, max_model_len=M)


def test_counts_lengths_arrivals(fixtures):
    tr = load(fixtures / "burstgpt_small.csv")
    assert len(tr) == 8 and tr.report["rows_in_file"] == 8
    assert [r.arrival_s for r in tr] == [0, 40, 113, 113, 125.5, 195, 196.25, 255]
    assert [r.prompt_len for r in tr] == [472, 1087, 417, 2000, 30, 812, 95, 5000]
    # the failed request (0 response tokens) is clipped to 1 and reported
    assert [r.max_tokens for r in tr] == [18, 1, 276, 301, 1200, 77, 40, 600]
    assert tr.report["clipped"]["zero_output"] == 1 and tr[1].meta["output_len"] == 0
    assert tr[2].meta == {
        "line": 4,
        "prompt_len": 417,
        "output_len": 276,
        "model": "GPT-4",
        "log_type": "Conversation log",
        "total_tokens": 693,
    }


def test_zero_output_skip_and_error(fixtures):
    tr = load(fixtures / "burstgpt_small.csv", zero_length="skip")
    assert len(tr) == 7 and tr.report["skipped"]["zero_output"] == 1
    with pytest.raises(TraceError) as e:
        load(fixtures / "burstgpt_small.csv", zero_length="error")
    assert e.value.line == 3 and e.value.field == "output"


def test_model_and_log_type_filters(fixtures):
    gpt4 = load(fixtures / "burstgpt_small.csv", models="GPT-4")
    assert [r.prompt_len for r in gpt4] == [417, 30, 95]
    assert gpt4[0].arrival_s == 0 and gpt4.report["rebase_offset_s"] == 113
    assert gpt4.report["skipped"]["filtered_model"] == 5
    conv = load(fixtures / "burstgpt_small.csv", models=["ChatGPT"], log_types=["Conversation log"])
    assert [r.prompt_len for r in conv] == [472, 1087, 812]
    assert conv.report["skipped"] == {**conv.report["skipped"], "filtered_model": 3, "filtered_log_type": 2}
    # windows use the file clock (not re-zeroed by the filter)
    w = load(fixtures / "burstgpt_small.csv", models="GPT-4", window=[120, 300], rebase=False)
    assert [r.arrival_s for r in w] == [125.5, 196.25]


def test_unknown_filter_value_is_an_error(fixtures):
    with pytest.raises(TraceError, match="values present") as e:
        load(fixtures / "burstgpt_small.csv", models=["GPT4"])
    assert e.value.field == "Model"
    with pytest.raises(TraceError, match="models"):
        load(fixtures / "burstgpt_small.csv", models=3)


def test_session_columns(fixtures):
    tr = load(fixtures / "burstgpt_sessions.csv")
    assert [r.meta["session_id"] for r in tr] == ["s1", "s1", "s2"]
    assert [r.meta["elapsed_time"] for r in tr] == [1.5, 2.25, 0.75]
    assert [r.arrival_s for r in tr] == [0, 2, 3]


def test_overlength_and_time_scale(fixtures):
    tr = load_trace(
        {"name": "burstgpt", "path": str(fixtures / "burstgpt_small.csv"), "time_scale": 10},
        vocab_size=V,
        max_model_len=1024,
    )
    assert all(r.prompt_len + r.max_tokens <= 1024 for r in tr)
    assert tr.report["clipped"]["overlength"] == 4  # 1087+1, 2000+301, 30+1200, 5000+600
    assert tr[4].max_tokens == 1023 and tr[4].prompt_len == 1  # output longer than the model
    assert tr.report["clipped"]["output_rows"] == 1
    assert tr[-1].arrival_s == pytest.approx(25.5)


@pytest.mark.parametrize(
    "text, line, field",
    [
        ("Timestamp,Model,Request tokens,Log Type\n1,ChatGPT,3,API log\n", 1, "Response tokens"),
        ("Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,3,4\nnow,ChatGPT,3,4\n", 3, "Timestamp"),
        ("Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,-3,4\n", 2, "Request tokens"),
        ("Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,3,four\n", 2, "Response tokens"),
    ],
)
def test_bad_input(write, text, line, field):
    p = write("b.csv", text)
    with pytest.raises(TraceError) as e:
        load(p)
    assert (e.value.line, e.value.field) == (line, field) and str(p) in str(e.value)


def test_filter_column_required_only_when_filtering(write):
    p = write("b.csv", "Timestamp,Request tokens,Response tokens\n1,3,4\n")
    assert len(load(p)) == 1
    with pytest.raises(TraceError, match="missing column"):
        load(p, log_types="API log")
