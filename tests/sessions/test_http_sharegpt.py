"""ShareGPT sessions over HTTP without a client tokenizer: the server's /tokenize (vLLM's) gives each turn's
ids, framed by the served model's chat template; each turn's prompt is the previous prompt, the ids the
engine generated and the new message's ids; later turns hit the prefix cache. The router relays
/tokenize and /detokenize."""

from pathlib import Path

import httpx
import pandas as pd
import pytest
from hydra import compose, initialize_config_module

from experiments.replay.http_replay import run_trace_http
from experiments.sessions import load_sessions
from experiments.sessions.http_replay import replay_sessions_http
from experiments.sessions.server_tokenizer import ServerTokenizer, ServerTokenizerError
from testbed import Engine
from testbed.cluster.http import RouterThread
from testbed.config import EngineConfig
from testbed.server import ServerThread

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MODEL = "smollm2-135m"  # a real tokenizer with a chat template
BS = 8
FIXTURE = Path(__file__).parent / "fixtures" / "sharegpt_small.json"
TRACE = {"name": "sharegpt_sessions", "path": str(FIXTURE), "think_s": 0.0, "output_len": 6}


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(model=MODEL, kernel="torch", block_size=BS, num_blocks=256, max_model_len=1024)
    with ServerThread(Engine(config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def router(server):
    with RouterThread({"backends": [server.url], "router": "round_robin", "probe_interval_s": 0.5}) as r:
        yield r


def turn_ids(sessions):
    return [[t.new_token_ids for t in s.turns] for s in sessions]


def test_server_tokenizer_gives_the_engines_ids_and_the_chat_prompt(server):
    tok = server.engine.tokenizer
    with ServerTokenizer(server.url, MODEL) as remote:
        over_http = load_sessions(TRACE, tok.vocab_size, 1024, tokenizer=remote)
    assert turn_ids(over_http) == turn_ids(load_sessions(TRACE, tok.vocab_size, 1024, tokenizer=tok))
    assert [len(s.turns) for s in over_http] == [3, 2, 1]  # the trailing "thanks" has no reply
    first = over_http[0].turns
    # turn 0 is the prompt /v1/chat/completions renders for the one message
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 1, "return_token_ids": True}  # fmt: skip
    assert httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["prompt_token_ids"] == (
        first[0].new_token_ids
    )
    # a later turn: the assistant turn's end, the user message, the generation prompt (no system prompt again)
    expected = "<|im_end|>\n<|im_start|>user\nAnd how many people live there?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(first[1].new_token_ids) == expected
    raw = load_sessions(TRACE | {"chat_template": False}, tok.vocab_size, 1024, tokenizer=tok)
    assert tok.decode(raw[0].turns[1].new_token_ids) == "And how many people live there?"
    with pytest.raises(ServerTokenizerError, match="model_not_found|does not exist"):
        ServerTokenizer(server.url, "other-model").encode("hi")


def test_each_turn_extends_the_engines_history_and_hits_its_blocks(server):
    tok = server.engine.tokenizer
    with ServerTokenizer(server.url, MODEL) as remote:
        sessions = load_sessions(TRACE, tok.vocab_size, 1024, tokenizer=remote)
    run = replay_sessions_http(sessions, server.url, MODEL, max_model_len=1024, keep_token_ids=True)
    assert (run.requests["error"] == "").all(), run.requests["error"].tolist()
    assert len(run.turns) == 6 and run.turns_cut == 0
    cached = dict(zip(run.requests["request_id"], run.requests["cached_tokens"]))
    for s in sessions:
        ids = [run.token_ids[f"{s.session_id}.t{k}"] for k in range(len(s.turns))]
        assert ids[0].prompt == s.turns[0].new_token_ids
        for k in range(1, len(s.turns)):
            history = ids[k - 1].prompt + ids[k - 1].generated
            assert len(ids[k - 1].generated) == 6
            assert ids[k].prompt == history + s.turns[k].new_token_ids
            full_blocks = (len(history) - 1) // BS  # the last answer token has no KV yet
            assert cached[f"{s.session_id}.t{k}"] >= full_blocks * BS > 0
    text = tok.decode(ids[-1].prompt)  # the last session's history reads as the chat
    assert text.count("<|im_start|>user\n") == len(sessions[-1].turns)


def test_router_relays_tokenize_and_refuses_bad_bodies(server, router):
    direct = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}, timeout=30).json()
    via = httpx.post(router.url + "/tokenize", json={"prompt": "Hello world"}, timeout=30)
    assert via.status_code == 200 and via.json() == direct
    assert via.headers["x-testbed-backend"] == server.url
    back = httpx.post(router.url + "/detokenize", json={"tokens": direct["tokens"]}, timeout=30).json()
    assert back["prompt"] == httpx.post(server.url + "/detokenize", json={"tokens": direct["tokens"]}).json()["prompt"]
    for path, body, param in [
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
    ]:
        r = httpx.post(router.url + path, json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
    r = httpx.post(router.url + "/tokenize", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert all(b.healthy for b in router.pool.backends)  # the client's mistakes are not the backend's


def test_sharegpt_sessions_run_end_to_end_through_the_router(router, tmp_path):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=["replay=sessions", "trace=sharegpt_sessions", f"trace.path={FIXTURE}",
                                           "trace.output_len=6", "trace.think_s=0"])  # fmt: skip
    summary = run_trace_http(cfg, tmp_path / "run", router.url, quiet=True)
    turns = pd.read_parquet(tmp_path / "run" / "turns.parquet")
    assert summary["completed"] == 6 and len(turns) == 6
    later = turns[turns["turn"] > 0]
    assert (later["cached_tokens"] > 0).all() and summary["later_turn_prefix_hit_rate"] > 0.4
