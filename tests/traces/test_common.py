"""Shared options: over-length / zero-length policies, selection, config files, dispatch."""

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from experiments.traces import PROJECT_ROOT, TraceError, load_trace
from experiments.traces.common import Row, _policy, options

CONF = Path(__file__).resolve().parents[2] / "experiments" / "conf" / "trace"


def azure(fixtures, max_model_len, **kw):
    return load_trace(
        {"name": "azure", "path": str(fixtures / "azure_small.csv"), **kw},
        vocab_size=1000,
        max_model_len=max_model_len,
    )


def test_overlength_clip_reports_counts(fixtures):
    # rows (prompt, output): 374+44, 396+109, 879+55, 91+16, 4000+500, 12+1
    tr = azure(fixtures, 600)
    assert [(r.prompt_len, r.max_tokens) for r in tr] == [
        (374, 44),
        (396, 109),
        (545, 55),
        (91, 16),
        (100, 500),
        (12, 1),
    ]
    rep = tr.report
    assert rep["overlength_policy"] == "clip" and rep["max_model_len"] == 600
    assert rep["clipped"]["overlength"] == 2 and rep["clipped"]["prompt_tokens"] == 334 + 3900
    assert rep["clipped"]["output_rows"] == 0 and rep["requests"] == 6
    assert tr[2].meta["prompt_len"] == 879  # original kept in meta
    tiny = azure(fixtures, 50)
    assert (tiny[4].prompt_len, tiny[4].max_tokens) == (1, 49)  # prompt first, then output
    assert tiny.report["clipped"]["output_rows"] == 3


def test_overlength_skip_and_error(fixtures):
    tr = azure(fixtures, 600, overlength="skip")
    assert [r.prompt_len for r in tr] == [374, 396, 91, 12]
    assert tr.report["skipped"]["overlength"] == 2 and tr.report["rows_read"] == 6
    with pytest.raises(TraceError) as e:
        azure(fixtures, 600, overlength="error")
    assert e.value.line == 4 and "max_model_len 600" in str(e.value)


def test_max_requests_counts_kept_requests(fixtures):
    tr = azure(fixtures, 600, overlength="skip", max_requests=4)
    assert len(tr) == 4 and tr.report["rows_read"] == 6 and tr.report["stopped_at"] == "max_requests"


def test_zero_length_follows_overlength_unless_set(write):
    p = write(
        "z.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,0,5\n"
        "2023-01-01 00:00:01,7,0\n2023-01-01 00:00:02,7,7\n",
    )
    cfg = {"name": "azure", "path": str(p)}
    tr = load_trace(cfg, vocab_size=1000, max_model_len=64)
    assert [(r.prompt_len, r.max_tokens) for r in tr] == [(1, 5), (7, 1), (7, 7)]
    assert tr.report["clipped"]["zero_prompt"] == 1 and tr.report["clipped"]["zero_output"] == 1
    sk = load_trace({**cfg, "overlength": "skip"}, vocab_size=1000, max_model_len=64)
    assert len(sk) == 1 and sk.report["skipped"]["zero_prompt"] == 1 and sk.report["skipped"]["zero_output"] == 1
    assert sk.report["zero_length_policy"] == "skip"
    mixed = load_trace({**cfg, "overlength": "error", "zero_length": "clip"}, vocab_size=1000, max_model_len=64)
    assert len(mixed) == 3


@given(p=st.integers(0, 10_000), o=st.integers(0, 10_000), m=st.integers(2, 8192))
def test_clip_policy_invariants(p, o, m):
    opts = options({"name": "x"}, {})
    stats = Counter()
    np_, no = _policy(Row(0, 0.0, p, o, 1), opts, m, None, stats)
    assert np_ >= 1 and no >= 1 and np_ + no <= m
    if max(p, 1) + max(o, 1) <= m:
        assert (np_, no) == (max(p, 1), max(o, 1))
    elif max(o, 1) < m:
        assert no == max(o, 1)  # output kept whole when the prompt can absorb the cut


def test_window_rebase_and_empty_selection(fixtures):
    tr = azure(fixtures, 8192, window=[4.5, None])
    assert [r.prompt_len for r in tr] == [879, 91, 4000, 12]
    assert tr[0].arrival_s == pytest.approx(0.041877) and tr.report["skipped"]["before_window"] == 2
    with pytest.raises(TraceError, match="no requests selected"):
        azure(fixtures, 8192, window=[100, 200])
    with pytest.raises(TraceError, match="no requests selected"):
        azure(fixtures, 8192, start=6)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"window": [5, 1]}, "window"),
        ({"window": [1]}, "window"),
        ({"time_scale": 0}, "time_scale"),
        ({"overlength": "truncate"}, "overlength"),
        ({"zero_length": "drop"}, "zero_length"),
        ({"max_requests": 0}, "max_requests"),
        ({"start": -1}, "start"),
        ({"seed": "a"}, "seed"),
        ({"token_low": 5000}, "token_low"),
        ({"token_low": -1}, "token_low"),
        ({"rebase": "yes"}, "rebase"),
        ({"windw": [0, 1]}, None),
    ],
)
def test_bad_common_options(fixtures, kw, field):
    with pytest.raises(TraceError) as e:
        azure(fixtures, 8192, **kw)
    assert e.value.field == field


def conf_file(name: str):
    """A trace group's yaml as a plain config: its Hydra defaults list (the typed schema) is composition's."""
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    cfg.pop("defaults", None)
    return cfg


def test_dispatch_errors():
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace({"name": "csv"}, vocab_size=1000, max_model_len=64)
    with pytest.raises(TraceError, match="max_model_len"):
        load_trace({"name": "synthetic"}, vocab_size=1000, max_model_len=1)
    with pytest.raises(TraceError, match="integers"):
        load_trace({"name": "synthetic"}, vocab_size=1000.0, max_model_len=64)
    with pytest.raises(TraceError, match="trace.path"):  # burstgpt.yaml leaves path as ???
        load_trace(conf_file("burstgpt"), vocab_size=1000, max_model_len=64)


@pytest.mark.parametrize("name", ["azure", "mooncake", "burstgpt", "sharegpt", "synthetic"])
def test_conf_files_load(name, fixtures, tok, monkeypatch, tmp_path):
    cfg = conf_file(name)
    assert cfg.name == name
    if OmegaConf.is_missing(cfg, "path"):  # no sample shipped for these two
        cfg.path = str(fixtures / {"burstgpt": "burstgpt_small.csv", "sharegpt": "sharegpt_small.json"}[name])
    cfg.max_requests = 5
    monkeypatch.chdir(tmp_path)  # relative default paths resolve against the project root
    tr = load_trace(cfg, vocab_size=5100, max_model_len=2048, tokenizer=tok)
    assert 1 <= len(tr) <= 5 and tr.report["format"] == name
    assert all(r.prompt_len + r.max_tokens <= 2048 and r.max_tokens >= 1 for r in tr)


def test_hydra_config_group():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="experiments.conf", version_base=None):
        cfg = compose(overrides=["+trace=synthetic", "trace.num_requests=7", "trace.rate=null"])
    tr = load_trace(cfg.trace, vocab_size=1000, max_model_len=4096)
    assert len(tr) == 7 and all(r.arrival_s == 0 for r in tr)
    assert CONF.parents[2] == PROJECT_ROOT
