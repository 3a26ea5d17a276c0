"""A Request keeps the caller's prompt list (no copy: a replay's prompts hold millions of tokens) and grows a
token list of its own: decoding, a whole request's life, never changes the caller's list."""

from testbed.request import Request
from testbed.sampling_params import SamplingParams


def test_prompt_is_the_callers_list_and_decoding_leaves_it_alone():
    prompt = [5, 6, 7]
    request = Request("r", prompt, SamplingParams(max_tokens=4), arrival_time=0.0)
    assert request.prompt_token_ids is prompt
    for t, token in enumerate([9, 8, 7, 6]):
        request.append_output_token(token, None, float(t))
    request.all_token_ids.extend([1, 2])  # as a simulated decode run extends it
    assert prompt == [5, 6, 7]
    assert request.prompt_token_ids == [5, 6, 7] and request.num_prompt_tokens == 3
    assert request.all_token_ids == [5, 6, 7, 9, 8, 7, 6, 1, 2]
    assert request.max_num_tokens == 7


def test_other_sequences_become_a_list():
    request = Request("r", (1, 2), SamplingParams(max_tokens=1), arrival_time=0.0)
    assert type(request.prompt_token_ids) is list and request.prompt_token_ids == [1, 2]
    request.append_output_token(3, None, 0.0)
    assert request.prompt_token_ids == [1, 2] and request.all_token_ids == [1, 2, 3]
