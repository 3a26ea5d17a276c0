"""ShareGPT loader: real tokenised prompts, reference output lengths, synthesised arrivals."""

import json

import numpy as np
import pytest

from experiments.traces import TraceError, load_trace

V, M = 5100, 4096


def load(path, tok, max_model_len=M, **kw):
    return load_trace(
        {"name": "sharegpt", "path": str(path), **kw},
        vocab_size=V,
        max_model_len=max_model_len,
        tokenizer=tok,
    )


def test_prompts_outputs_and_skips(fixtures, tok):
    tr = load(fixtures / "sharegpt_small.json", tok)
    assert [r.meta["id"] for r in tr] == ["a1", "c3", "f6", "g7"]
    assert tr[0].prompt_token_ids == tok.encode("what is the capital of france")
    assert tr[0].max_tokens == 6  # "the capital of france is paris", no BOS
    assert tr[1].prompt_token_ids == tok.encode("name three colours please")  # user/assistant roles
    assert tr[1].max_tokens == 3
    assert tr[3].max_tokens == 1 and tr.report["clipped"]["zero_output"] == 1  # empty reply
    assert tr.report["skipped"]["no_human_turn"] == 2  # b2 (gpt only), e5 (empty)
    assert tr.report["skipped"]["no_gpt_turn"] == 1  # d4
    assert tr.report["rows_in_file"] == 7 and tr.report["rows_read"] == 4
    assert all(r.arrival_s == 0 for r in tr)  # rate null: all at once
    assert tr[2].meta["entry"] == 5 and tr[2].meta["line"] == "entry 5"


def test_poisson_arrivals_and_time_scale(fixtures, tok):
    a = load(fixtures / "sharegpt_small.json", tok, rate=2.0, seed=3)
    b = load(fixtures / "sharegpt_small.json", tok, rate=2.0, seed=3, time_scale=2.0)
    t = [r.arrival_s for r in a]
    assert t[0] == 0 and all(x < y for x, y in zip(t, t[1:]))
    assert [r.arrival_s for r in b] == pytest.approx([x / 2 for x in t])


def test_rate_statistics(write, tok):
    convs = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}],
        }
        for i in range(2000)
    ]
    p = write("many.json", json.dumps(convs))
    tr = load(p, tok, rate=5.0, seed=0)
    gaps = np.diff([r.arrival_s for r in tr])
    assert gaps.mean() == pytest.approx(0.2, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.15)  # Poisson: CV 1
    few = load(p, tok, rate=5.0, max_requests=10)
    assert len(few) == 10 and few.report["rows_read"] == 10  # lazy: only 10 tokenised


def test_shuffle_output_len_and_clip(fixtures, tok):
    s = load(fixtures / "sharegpt_small.json", tok, shuffle=True, seed=1, output_len=7)
    assert sorted(r.meta["id"] for r in s) == ["a1", "c3", "f6", "g7"]
    assert all(r.max_tokens == 7 for r in s)
    c = load(fixtures / "sharegpt_small.json", tok, max_model_len=8, output_len=4)
    full = load(fixtures / "sharegpt_small.json", tok)
    f6 = [r for r in c if r.meta["id"] == "f6"][0]
    assert f6.prompt_len == 4 and f6.prompt_token_ids == full[2].prompt_token_ids[:4]


def test_needs_tokenizer(fixtures):
    with pytest.raises(TraceError, match="tokenizer"):
        load(fixtures / "sharegpt_small.json", None)


@pytest.mark.parametrize(
    "text, match, line",
    [
        ('[{"id": 1, "conversations": [}]', "malformed JSON", 1),
        ('{"id": 1}', "JSON list", None),
        ("[]", "empty list", None),
        ('[{"id": 1}]', "conversations", "entry 0"),
        ('[{"id": 1, "conversations": [{"from": "human"}]}]', "turn 0", "entry 0"),
        ('[{"id": 1, "conversations": [{"from": "gpt", "value": "x"}]}]', "no requests selected", None),
    ],
)
def test_bad_input(write, tok, text, match, line):
    p = write("bad.json", text)
    with pytest.raises(TraceError, match=match) as e:
        load(p, tok)
    assert e.value.line == line and str(p) in str(e.value)


def test_bad_rate(fixtures, tok):
    with pytest.raises(TraceError, match="rate"):
        load(fixtures / "sharegpt_small.json", tok, rate=-1.0)


def test_hf_tokenizer(fixtures):
    """The real tokenizer API (PreTrainedTokenizerFast), built offline from a word-level vocab."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    conversations = json.loads((fixtures / "sharegpt_small.json").read_text())
    words = sorted({w for c in conversations for t in c["conversations"] for w in t["value"].split()})
    vocab = {"<unk>": 0, "<s>": 1, **{w: 100 + i for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>")
    tr = load(fixtures / "sharegpt_small.json", hf)
    assert tr[0].prompt_token_ids[0] == 1 and len(tr[0].prompt_token_ids) == 7  # BOS + 6 words
    assert tr[0].max_tokens == 6  # the reply is counted without BOS
