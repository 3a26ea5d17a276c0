"""The prompt checks (testbed.input_processor) refuse exactly what the item-by-item checks refuse, with the
same error, and accept the rest: the one-pass scan of a list of plain ints (plain_int_bounds) against the
straightforward checks (type of every item, then min and max), on prompts of every kind of item."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed import Engine, EngineConfig, SamplingParams
from testbed.input_processor import plain_int_bounds
from testbed.validation import is_int

VOCAB = 1000


class Sub(int):
    pass


def reference(prompt, params, request_id: str, vocab: int, max_model_len: int) -> None:
    """The checks check() makes up to the vocabulary, item by item."""
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (list, tuple, range)):
        raise TypeError(
            f"request {request_id}: prompt_token_ids must be a list of int token ids, got "
            f"{type(prompt).__name__} (tokenize text first, or use LLM.generate)"
        )
    for i, t in enumerate(prompt):
        if not is_int(t):
            what = f"{t!r} ({type(t).__name__})"
            raise TypeError(f"request {request_id}: token ids must be ints, got {what} at position {i}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"request {request_id}: sampling params must be SamplingParams, got {type(params).__name__}")
    if len(prompt) == 0:
        raise ValueError(f"request {request_id}: the prompt is empty")
    if len(prompt) >= max_model_len:
        raise ValueError(
            f"request {request_id}: prompt of {len(prompt)} tokens leaves no room to generate within "
            f"max_model_len={max_model_len}"
        )
    for t in prompt:
        if not 0 <= t < vocab:
            raise ValueError(f"request {request_id}: token id {t} outside the vocabulary [0, {vocab})")


@pytest.fixture(scope="module")
def engine():
    config = EngineConfig(
        model="llama-3.1-8b", executor="sim", sim_config={"device": "h100-sxm"}, num_blocks=4096, max_model_len=256
    )
    engine = Engine(config)
    engine.input_processor.vocab_size = VOCAB  # small, so that ids outside it are easy to draw
    return engine


def outcome(check, *args):
    try:
        check(*args)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    return None


ITEMS = st.one_of(
    st.integers(0, VOCAB - 1),
    st.integers(0, VOCAB - 1),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, VOCAB, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63, True, False, 0, 1]),
    st.integers(0, VOCAB - 1).map(np.int64),
    st.integers(0, 2**40).map(np.uint64),
    st.integers(0, VOCAB - 1).map(Sub),
    st.floats(allow_nan=True),
    st.sampled_from([None, "7", b"7", [3], (3,), 2.0, 3 + 0j]),
)


@settings(max_examples=400, deadline=None)
@given(
    items=st.lists(ITEMS, max_size=300),
    container=st.sampled_from([list, list, tuple, lambda items: np.array(items, dtype=object), str]),
)
def test_refuses_what_the_item_by_item_checks_refuse(engine, items, container):
    prompt = container(items)
    params = SamplingParams(max_tokens=4)
    got = outcome(engine.input_processor.check, prompt, params, "r")
    want = outcome(reference, prompt, params, "r", VOCAB, engine.max_model_len)
    assert got == want


def test_plain_int_bounds_only_for_lists_of_plain_ints():
    assert plain_int_bounds([5, 3, 9]) == (3, 9)
    assert plain_int_bounds([-(2**31), 2**31 - 1]) == (-(2**31), 2**31 - 1)
    others = ([], [1, True], [1, 2**31], [1, -(2**31) - 1], [1, np.int64(2)], [1, Sub(2)], [1, 2.0], (1, 2), [[1]])
    for prompt in others:
        assert plain_int_bounds(prompt) is None, prompt
    # the length of n ints from other items: 1 byte (bool, None) + 9 (a float) = 10; 1 + 1 + 13 (a big int) = 15
    for prompt in ([True, 2.0], [None, 2.5], [3, True, False, 2**45, 4]):
        assert plain_int_bounds(prompt) is None, prompt


def test_params_type_still_checked(engine):
    with pytest.raises(TypeError, match="must be SamplingParams"):
        engine.input_processor.check([1, 2], {"max_tokens": 3}, "p")
