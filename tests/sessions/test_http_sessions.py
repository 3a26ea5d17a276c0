"""Session replay over HTTP: each turn's prompt is the server's own tokens of the history (return_token_ids)
plus the new message, so the server's prefix cache serves the history back; the experiment over HTTP
writes the same per-turn results as in process."""

import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from experiments.replay.http_replay import run_trace_http
from experiments.sessions import load_sessions
from experiments.sessions.http_replay import replay_sessions_http
from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BS = 4


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(model="tiny", kernel="torch", block_size=BS, num_blocks=512, max_num_seqs=8)
    with ServerThread(Engine(config)) as srv:
        yield srv


def test_turn_k_plus_1_sends_the_engines_tokens_and_hits_its_full_blocks(server):
    opts = {"name": "sessions", "num_sessions": 3, "turns": [3, 3], "first_tokens": [9, 14], "new_tokens": [3, 6],
            "output_tokens": [3, 7], "think_s": 0.0}  # fmt: skip
    sessions = load_sessions(opts, vocab_size=256, max_model_len=512)
    run = replay_sessions_http(sessions, server.url, "tiny", max_model_len=512)
    assert run.turns_cut == 0 and len(run.turns) == 9
    assert (run.requests["error"] == "").all(), run.requests["error"].tolist()
    table = run.turns.merge(run.requests, on="request_id", suffixes=("", "_req"))
    for s in sessions:
        rows = table[table["session_id"] == s.session_id].sort_values("turn").to_dict("records")
        for prev, cur in zip(rows, rows[1:]):
            # the history is the previous prompt and every token the server generated for it
            assert cur["history_tokens"] == prev["prompt_tokens"] + prev["output_tokens"]
            assert cur["prompt_tokens"] == cur["history_tokens"] + len(s.turns[cur["turn"]].new_token_ids)
            full_blocks = (cur["history_tokens"] - 1) // BS  # the last answer token has no KV yet
            assert cur["cached_tokens"] >= full_blocks * BS > 0, (prev, cur)
            assert cur["arrival_time"] >= prev["finish_time"]


def test_http_experiment_writes_turns_and_per_turn_summary(server, tmp_path):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["replay=sessions", "trace=sessions", "trace.num_sessions=2", "trace.turns=2",
                       "trace.first_tokens=12", "trace.new_tokens=4", "trace.output_tokens=4", "trace.think_s=0"],
        )  # fmt: skip
    summary = run_trace_http(cfg, tmp_path / "run", server.url, quiet=True)
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert len(turns) == 4 and summary["turns_sent"] == 4 and summary["completed"] == 4
    assert summary["later_turn_prefix_hit_rate"] > 0.5  # 16 of 20 prompt tokens are history; 12 in full blocks
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["turn_1_cached_share"] > 0.5
