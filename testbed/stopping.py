"""When a request ends: the stop rules, in one place.

Token rules (EOS unless ignored, `stop_token_ids`, `max_tokens`, the model's context) are checked by the
scheduler as it appends each sampled token, because they bound how many tokens the request computes (a
request with drafts must not append past its stop). String rules (`stop`) need text, so the output
processor checks them on the incrementally detokenized output and ends the request from outside the step.
vLLM v1 splits them the same way (Scheduler.check_stop / the detokenizer's stop-string check).
"""

from testbed.request import Request, RequestStatus


def check_token_stop(request: Request, token: int, max_model_len: int) -> bool:
    """Set the request's finished status if `token`, just appended, ends it; True if it did."""
    params = request.sampling_params
    if not params.ignore_eos and token in request.eos_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
    elif token in params.stop_token_ids:
        request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, token
    elif (
        params.max_tokens is not None
        and request.num_output_tokens >= params.max_tokens
        or request.num_tokens >= max_model_len
    ):
        request.status = RequestStatus.FINISHED_LENGTH
    return request.is_finished


def append_until_stop(
    request: Request, tokens: list[int], token_logprobs: list[dict] | None, now: float, max_model_len: int
) -> list[int]:
    """Append sampled tokens (several: speculative decoding) up to the first that ends the request;
    returns those appended."""
    stop_ids, max_num_tokens, all_tokens = request.stop_check_ids, request.max_num_tokens, request.all_token_ids
    for j, token in enumerate(tokens):
        request.append_output_token(token, token_logprobs[j] if token_logprobs else None, now)
        # cheap filter first: only a stop/EOS token or the length limit can end a request (then it does)
        if (token in stop_ids or len(all_tokens) >= max_num_tokens) and check_token_stop(request, token, max_model_len):
            return tokens[: j + 1]
    return tokens


def find_stop_string(text: str, stops, start: int) -> str | None:
    """The first of `stops` (in the given order) found in text that ends at or after `start` (the text
    before it was checked already), or None."""
    for stop in stops:
        if stop in text[max(0, start - len(stop) + 1) :]:
            return stop
    return None
