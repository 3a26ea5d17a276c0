"""The vLLM metric names added for real clients: request parameters at finish, the cache configuration, and
speculative decoding's per-position acceptance, read back with prometheus_client's parser."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

MODEL = "smollm2-135m"
COUNTING = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4,"


@pytest.fixture(scope="module")
def server(one_torch_thread):
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    engine = Engine(EngineConfig(model=MODEL, num_blocks=96, max_model_len=512, speculative_config=spec))
    with ServerThread(engine) as srv:
        yield srv


def _families(url):
    return {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)}


def _value(family, suffix, **labels):
    return sum(
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_request_parameter_histograms(server, wait_for):
    url, body = server.url + "/v1/completions", {"model": MODEL, "prompt": COUNTING}
    assert httpx.post(url, json={**body, "max_tokens": 3}, timeout=120).status_code == 200
    r = httpx.post(url, json={**body, "max_tokens": 7, "n": 2, "temperature": 1.0, "seed": 1}, timeout=120)
    longest = max(len(server.engine.tokenizer.encode(c["text"], add_special_tokens=False)) for c in r.json()["choices"])
    assert wait_for(lambda: server.async_engine.num_in_flight == 0, timeout=30)
    f = _families(server.url)
    n, max_tokens = f["vllm:request_params_n"], f["vllm:request_params_max_tokens"]
    generated = f["vllm:request_max_num_generation_tokens"]
    assert _value(n, "_count") == _value(max_tokens, "_count") == _value(generated, "_count") == 2
    assert _value(n, "_sum") == 3 and _value(max_tokens, "_sum") == 10
    assert _value(n, "_bucket", le="1.0") == 1 and _value(n, "_bucket", le="2.0") == 2
    assert 3 + longest - 1 <= _value(generated, "_sum") <= 3 + 7


def test_cache_config_info(server):
    info = _families(server.url)["vllm:cache_config_info"]
    (sample,) = info.samples
    assert sample.value == 1
    config = server.engine.config
    assert sample.labels["block_size"] == str(config.cache.block_size)
    assert sample.labels["num_gpu_blocks"] == str(server.engine.kv.num_blocks) == "96"
    assert sample.labels["enable_prefix_caching"] == str(config.cache.prefix_caching)
    assert sample.labels["cache_dtype"] == config.cache.dtype


def test_spec_decode_accepted_per_position_has_samples(server, wait_for):
    body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 16, "temperature": 0}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=120).status_code == 200
    assert wait_for(lambda: server.async_engine.num_in_flight == 0, timeout=30)
    family = _families(server.url)["vllm:spec_decode_num_accepted_tokens_per_pos"]
    accepted = server.engine.speculator.metrics.accepted_per_position
    assert len(accepted) == 3 and accepted[0] > 0  # the counting prompt repeats: n-gram drafts are accepted
    for pos, value in enumerate(accepted):
        assert _value(family, "_total", position=str(pos)) == value
