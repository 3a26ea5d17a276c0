"""Session replay: each turn's prompt is the previous prompt + the engine's answer + a new message, and the
prefix cache serves the history back."""

import json
import time

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from experiments.results.recorder import Recorder
from experiments.run.runner import run_trace
from experiments.sessions import Session, Turn, load_sessions
from experiments.sessions.mooncake import group
from experiments.sessions.replay import SessionReplay
from experiments.traces import RequestSpec, TraceError
from testbed import Engine
from testbed.config import EngineConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BS = 4


def cfg(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=["progress=false", "model=tiny", "cache.num_blocks=512", *overrides])


def synthetic(n=3, **kw):
    opts = {"name": "sessions", "num_sessions": n, "turns": [3, 3], "first_tokens": [9, 14], "new_tokens": [3, 6],
            "output_tokens": [3, 7], "think_s": 0.0, **kw}  # fmt: skip
    return load_sessions(opts, vocab_size=256, max_model_len=512)


def replay(sessions, num_blocks=512, executor="real", concurrency=None):
    sim = {"device": "h100-sxm"} if executor == "sim" else None
    engine = Engine(EngineConfig(model="tiny", kernel="torch", block_size=BS, num_blocks=num_blocks, executor=executor,
                                 sim_config=sim, max_num_seqs=8))  # fmt: skip
    rep = SessionReplay.of_engine(engine, Recorder().attach(engine), sleep=getattr(engine.clock, "sleep", time.sleep))
    rep.run(sessions, "sessions", concurrency)
    return rep


@pytest.mark.parametrize("executor", ["real", "sim"])
def test_next_turn_is_history_plus_answer_and_hits_its_full_blocks(executor):
    sessions = synthetic()
    rep = replay(sessions, executor=executor)
    assert len(rep.turn_rows) == 9 and rep.turns_cut == 0
    rows = rep.recorder.requests
    for s in sessions:
        for k in range(1, len(s.turns)):
            prev, cur = rep.replicas.requests[f"{s.session_id}.t{k - 1}"], rep.replicas.requests[f"{s.session_id}.t{k}"]
            history = list(prev.prompt_token_ids) + list(prev.output_token_ids)
            assert list(cur.prompt_token_ids) == history + s.turns[k].new_token_ids
            # the engine computed KV for every history token but the last answer token
            full_blocks = (len(history) - 1) // BS
            assert rows[cur.request_id]["cached_tokens"] >= full_blocks * BS
            assert rows[cur.request_id]["arrival_time"] >= rows[prev.request_id]["finish_time"]


def test_a_small_cache_loses_history_that_a_large_one_keeps():
    sessions = synthetic(n=6)
    big, small = replay(sessions, num_blocks=512, executor="sim"), replay(sessions, num_blocks=24, executor="sim")

    def later_hits(rep):
        return sum(r["cached_tokens"] for r in rep.recorder.requests.values() if not r["request_id"].endswith(".t0"))

    assert later_hits(small) < later_hits(big)


def test_concurrency_caps_active_sessions():
    sessions = synthetic(n=3)
    rep = replay(sessions, executor="sim", concurrency=1)
    rows = rep.recorder.requests
    spans = sorted(
        (min(rows[f"{s.session_id}.t{k}"]["arrival_time"] for k in range(3)),
         max(rows[f"{s.session_id}.t{k}"]["finish_time"] for k in range(3))) for s in sessions
    )  # fmt: skip
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))


def test_think_time_delays_the_next_turn():
    sessions = synthetic(n=2, think_s=5.0, think_dist="fixed")
    rep = replay(sessions, executor="sim")
    rows = rep.recorder.requests
    for s in sessions:
        first, second = rows[f"{s.session_id}.t0"], rows[f"{s.session_id}.t1"]
        assert second["arrival_time"] == pytest.approx(first["finish_time"] + 5.0)


def test_runner_writes_per_turn_metrics(tmp_path):
    summary = run_trace(
        cfg("executor=sim", "device=h100-sxm", "trace=sessions", "replay=sessions", "trace.num_sessions=3",
            "trace.turns=3", "trace.think_s=0.5", "cache.block_size=16"), tmp_path,
    )  # fmt: skip
    turns = pd.read_parquet(tmp_path / "turns.parquet")
    assert len(turns) == summary["turns_sent"] == 9
    assert set(turns["turn"]) == {0, 1, 2}
    later = turns[turns["turn"] > 0]
    assert (later["cached_tokens"] >= (later["history_tokens"] - 1) // 16 * 16).all()
    assert summary["turn_0_cached_share"] == 0.0 and summary["turn_2_cached_share"] > 0.5
    assert json.loads((tmp_path / "trace_report.json").read_text())["sessions"] == 3


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["trace=azure", "replay=sessions"], "session source"),
        (["trace=sessions", "replay=offline"], "replay=sessions"),
        (["trace=sessions", "replay=sessions", "replay.length_scale=0.5"], "length_scale"),
        (["trace=sessions", "replay=sessions", "+trace.turn=3"], "unknown trace option"),
        (["trace=sessions", "replay=sessions", "trace.turns=[4,2]"], "turns"),
    ],
)
def test_bad_session_configs_are_refused(tmp_path, overrides, match):
    with pytest.raises((ValueError, TraceError), match=match):
        run_trace(cfg("executor=sim", "device=h100-sxm", *overrides), tmp_path)


def _spec(i, t, ids, out=4):
    return RequestSpec(f"r{i}", t, list(range(1000 * i, 1000 * i + 10 * len(ids) - 3)), out, meta={"hash_ids": ids})


def test_mooncake_requests_extending_a_whole_history_continue_its_session():
    specs = [
        _spec(0, 0.0, [1, 2]),
        _spec(1, 1.0, [1, 7, 8]),  # r0's blocks but its (partly filled) last: continues r0
        _spec(2, 2.0, [1, 9]),  # r0's history again, but r0's session moved on: a new session
        _spec(3, 3.0, [1, 7, 8, 5, 6]),  # continues r1
        _spec(4, 4.0, [3]),  # shares nothing
    ]
    sessions = group(specs, block_size=10)
    assert [len(s.turns) for s in sessions] == [3, 1, 1]
    s = sessions[0]
    assert s.meta["request_ids"] == ["r0", "r1", "r3"]
    assert [t.think_s for t in s.turns[1:]] == [1.0, 2.0]
    assert s.turns[1].new_token_ids == specs[1].prompt_token_ids[10:]  # after the shared block
    assert s.turns[2].new_token_ids == specs[3].prompt_token_ids[20:]


def test_mooncake_sessions_load_from_the_shipped_sample():
    sessions = load_sessions(
        {"name": "mooncake_sessions", "path": "experiments/data/mooncake_fast25_synthetic_sample.jsonl"},
        256,
        1 << 20,
    )
    assert sum(len(s.turns) for s in sessions) == 200
    assert max(len(s.turns) for s in sessions) == 4


def test_sharegpt_conversations_become_sessions(tmp_path, tokenizer):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"},
                                      {"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": "7"},
                                      {"from": "human", "value": "no reply"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "orphan"}]},
    ]  # fmt: skip
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    sessions = load_sessions({"name": "sharegpt_sessions", "path": str(path), "think_s": 0.0}, 49152, 2048, tokenizer)
    assert len(sessions) == 1 and len(sessions[0].turns) == 2
    t1 = sessions[0].turns[1]
    # framed by the chat template: the assistant turn's end, the user message, the generation prompt
    assert tokenizer.decode(t1.new_token_ids) == (
        "<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t1.max_tokens == len(tokenizer.encode("7", add_special_tokens=False))
    opts = {"name": "sharegpt_sessions", "path": str(path), "think_s": 0.0, "chat_template": False}
    raw = load_sessions(opts, 49152, 2048, tokenizer)
    assert tokenizer.decode(raw[0].turns[1].new_token_ids) == "Name a prime."
    with pytest.raises(TraceError, match="chat_template"):
        load_sessions(opts | {"chat_template": True}, 49152, 2048, PlainTokenizer(tokenizer))
    with pytest.raises(TraceError, match="chat_template"):
        load_sessions(opts | {"chat_template": True}, 49152, 2048, MergingTemplate())
    with pytest.raises(TraceError, match="chat_template"):
        load_sessions(opts | {"chat_template": "yes"}, 49152, 2048, tokenizer)


class PlainTokenizer:
    """An HF tokenizer's encode without a chat template."""

    chat_template = None

    def __init__(self, tokenizer):
        self.encode = tokenizer.encode


class MergingTemplate:
    """A template whose next turn re-tokenizes the assistant message's end (it cannot extend an answer)."""

    def encode(self, text, add_special_tokens=True):
        return [len(text)]

    def encode_chat(self, messages, add_generation_prompt=True, continue_final_message=False):
        return [len(messages), 7] if continue_final_message else [len(messages), 8, 9]


def test_session_types_are_plain():
    s = Session("x", 0.0, [Turn([1, 2], 3)])
    assert s.turns[0].think_s == 0.0
