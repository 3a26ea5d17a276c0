"""Sampling controls, logprobs, structured output, cached-token usage and vLLM-named metrics over HTTP,
against a live smollm2-135m server (the official `openai` client); bad values get the in-process message."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed import Engine, SamplingParams
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Give me a person as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(one_torch_thread):
    engine = Engine(EngineConfig(model=MODEL, num_blocks=160, max_model_len=1024, max_num_seqs=8))
    with ServerThread(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_top_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=5
    )
    for item in r.choices[0].logprobs.content:
        top = item.top_logprobs
        assert len(top) == 5 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert top[0].token == item.token and top[0].logprob == pytest.approx(item.logprob)  # greedy: the top one
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=5, stream=True
    )
    streamed = [
        item for ch in stream if ch.choices and ch.choices[0].logprobs for item in ch.choices[0].logprobs.content
    ]
    # the second request reads its prompt from the prefix cache, so its prefill multiplies other shapes:
    # the same tokens and rankings, logprobs equal up to float32 rounding
    assert [(i.token, [t.token for t in i.top_logprobs]) for i in streamed] == [
        (i.token, [t.token for t in i.top_logprobs]) for i in r.choices[0].logprobs.content
    ]
    assert [i.logprob for i in streamed] == pytest.approx([i.logprob for i in r.choices[0].logprobs.content], abs=1e-4)


def test_completion_logprobs_with_echo(server, client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True)
    choice, n_prompt = r.choices[0], len(server.engine.tokenizer.encode(PROMPT))
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == n_prompt + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs[1:])  # the token itself + the 2 most likely
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2, echo=True, stream=True
    )
    chunks = [ch.choices[0] for ch in stream if ch.choices]
    assert "".join(c.text for c in chunks) == choice.text
    assert [v for c in chunks for v in c.logprobs.token_logprobs] == lp.token_logprobs
    # vLLM's prompt_logprobs field: the same numbers as the echoed prompt's logprobs
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == n_prompt and plp[0] is None
    ids = server.engine.tokenizer.encode(PROMPT)
    for q in range(1, n_prompt):
        assert plp[q][str(ids[q])]["logprob"] == pytest.approx(lp.token_logprobs[q], abs=1e-4)


def test_penalties_bias_bans_and_min_tokens(server, client):
    tok = server.engine.tokenizer
    base = dict(model=MODEL, prompt="1, 2, 1, 2, 1, 2, 1, 2,", max_tokens=12, temperature=0)
    plain = client.completions.create(**base, extra_body={"ignore_eos": True}).choices[0].text
    pen = client.completions.create(**base, frequency_penalty=2.0, extra_body={"ignore_eos": True}).choices[0].text
    assert pen != plain
    forced = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, logit_bias={"1000": 100}
    )
    assert forced.choices[0].text == tok.decode([1000, 1000])
    first_word = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
    word = first_word.split()[0]
    banned = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, extra_body={"bad_words": [word]}
    )
    assert banned.choices[0].text.split()[:1] != [word]
    eos = str(tok.eos_token_id)
    early = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logit_bias={eos: 60})
    assert early.usage.completion_tokens == 1
    held = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logit_bias={eos: 60}, extra_body={"min_tokens": 5}
    )
    assert held.usage.completion_tokens == 5


def test_structured_outputs(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}

    def one(seed):
        return client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=40, temperature=1.0, seed=seed, response_format=fmt,
            extra_body={"structured_outputs": None},
        )  # fmt: skip

    with ThreadPoolExecutor(4) as pool:  # together: the engine batches the four seeds' decode steps
        replies = list(pool.map(one, range(4)))
    for r in replies:
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    r = client.completions.create(
        model=MODEL, prompt="Pick one:", max_tokens=8, temperature=1.0, extra_body={"guided_choice": ["red", "blue"]}
    )
    assert r.choices[0].text in ("red", "blue")
    r = client.completions.create(
        model=MODEL, prompt="A date:", max_tokens=12, temperature=1.0, extra_body={"guided_regex": r"\d{4}-\d{2}"}
    )
    assert len(r.choices[0].text) == 7 and r.choices[0].text[4] == "-"
    r = client.completions.create(
        model=MODEL, prompt="Yes or no?", max_tokens=8, temperature=1.0,
        extra_body={"structured_outputs": {"grammar": 'root ::= "yes" | "no"'}},
    )  # fmt: skip
    assert r.choices[0].text in ("yes", "no")


def test_cached_tokens_in_usage(client):
    prompt = "Some shared context about the history of Europe. " * 6
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached < again.usage.prompt_tokens and cached % 16 == 0  # whole blocks of 16


# ---- bad input: the in-process ValueError's message, as a 400 naming the parameter -------------------------
def in_process_message(**kwargs) -> str:
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"presence_penalty": 2.5}, "presence_penalty", in_process_message(presence_penalty=2.5)),
        ({"frequency_penalty": -3}, "frequency_penalty", in_process_message(frequency_penalty=-3)),
        ({"repetition_penalty": 0}, "repetition_penalty", in_process_message(repetition_penalty=0)),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens", in_process_message(min_tokens=9, max_tokens=4)),
        ({"logprobs": 21}, "logprobs", in_process_message(logprobs=21)),
        ({"prompt_logprobs": 25}, "prompt_logprobs", in_process_message(prompt_logprobs=25)),
        ({"logit_bias": {"x": 1}}, "logit_bias", "logit_bias keys must be token ids"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias", "logit_bias holds token id 99999999 outside the vocabulary"),
        ({"allowed_token_ids": [-4]}, "allowed_token_ids", "allowed_token_ids holds token id -4"),
        ({"guided_json": {"type": "integer", "minimum": 3, "maximum": 1}}, "guided_json", "minimum greater"),
        ({"guided_json": "{broken"}, "guided_json", "not valid JSON"),
        ({"guided_regex": "(a"}, "guided_regex", "invalid regex"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_json": {}, "guided_regex": "a"}, None, "exactly one"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": False}}}, "response_format", "any"),
        ({"n": 0}, "n", "n must be at least 1, got 0."),
    ],
)
def test_bad_values(server, body, param, message):
    for path, base in [
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT}),
        ("/v1/chat/completions", {"model": MODEL, "messages": CHAT}),
    ]:
        if path.endswith("chat/completions") and "logprobs" in body:
            continue  # chat's logprobs is a boolean
        r = httpx.post(server.url + path, json={**base, **body}, timeout=60)
        assert r.status_code == 400, (path, body, r.text)
        err = r.json()["error"]
        assert message in err["message"], (path, err)
        assert err["type"] == "invalid_request_error"
        if param is not None:
            assert err["param"] == param, (path, err)


def test_chat_top_logprobs_limit(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, logprobs=True, top_logprobs=21)


# ---- metrics under vLLM's names, read by prometheus_client's own parser ------------------------------------
VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
}


def test_metrics_under_vllm_names(server, wait_for):
    assert wait_for(lambda: server.async_engine.num_in_flight == 0, timeout=30)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    for name, kind in VLLM_FAMILIES.items():
        assert families[name].type == kind, name
        assert all(
            s.labels.get("model_name") == MODEL and s.labels.get("engine") == "0" for s in families[name].samples
        )

    def value(family, sample_name, **labels):
        return sum(
            s.value
            for s in families[family].samples
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    engine = server.engine
    assert value("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == engine.kv.prefix_hits > 0
    assert value("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == engine.kv.prefix_queries
    finished = value("vllm:request_success", "vllm:request_success_total")
    assert finished == value("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") > 10
    assert value("vllm:request_queue_time_seconds", "vllm:request_queue_time_seconds_count") == finished
    assert value("vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count") == engine.step_count
    assert value("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") > 0
    assert value("vllm:num_requests_running", "vllm:num_requests_running") == 0
    assert value("testbed:structured_output_time_seconds", "testbed:structured_output_time_seconds_total") > 0
