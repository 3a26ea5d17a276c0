"""Bad input is a clear error naming the value and the limit, raised before any work starts."""

import pytest

from testbed import LLM, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return LLM(model="tiny", block_size=8, num_blocks=64, max_model_len=256)


def test_unknown_model_lists_known_names():
    with pytest.raises(ValueError, match="unknown model 'nope'.*smollm2-135m"):
        LLM(model="nope")


def test_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(model=str(tmp_path))


def test_prompt_longer_than_context(tiny):
    with pytest.raises(ValueError, match="300 tokens.*max_model_len=256"):
        tiny.generate([[100] * 300], SamplingParams(max_tokens=1))


def test_cache_too_small_for_one_request():
    llm = LLM(model="tiny", block_size=8, num_blocks=64, max_model_len=1024)
    with pytest.raises(ValueError, match="528 tokens need 66 KV blocks of 8, the whole cache has 64"):
        llm.generate([[100] * 200], SamplingParams(max_tokens=328))


def test_nothing_runs_when_one_prompt_is_bad(tiny):
    with pytest.raises(ValueError):
        tiny.generate([[100] * 10, [100] * 300], SamplingParams(max_tokens=2))
    assert not tiny.engine.has_unfinished()


def test_empty_prompt_and_out_of_vocab(tiny):
    with pytest.raises(ValueError, match="empty"):
        tiny.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="token id 99999 outside the vocabulary"):
        tiny.generate([[99999]], SamplingParams())


def test_string_prompt_without_tokenizer(tiny):
    with pytest.raises(ValueError, match="no tokenizer"):
        tiny.generate(["hello"])


def test_triton_needs_power_of_two_block_size():
    with pytest.raises(ValueError, match="power-of-two block_size, got 12"):
        LLM(model="tiny", kernel="triton", block_size=12)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(block_size=0), "block_size"),
        (dict(num_blocks=0), "num_blocks"),
        (dict(dtype="int8"), "dtype"),
        (dict(kernel="cuda"), "unknown kernel backend"),
        (dict(scheduler="nope"), "unknown scheduler"),
    ],
)
def test_bad_engine_options(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LLM(model="tiny", **kwargs)


def test_unknown_option_is_rejected():
    with pytest.raises(TypeError, match="unknown engine options"):
        EngineConfig.from_kwargs(blocksize=16)


def test_max_model_len_beyond_model(tiny):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LLM(model="tiny", max_model_len=10**7)
