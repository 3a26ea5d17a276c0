"""Sampled-token logprobs in OpenAI's two shapes: completions (parallel lists) and chat (one entry a token).
The engine keeps only the sampled token's logprob, so top_logprobs holds that token alone."""

from __future__ import annotations

from testbed.detokenize import token_strings


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[float], offset: int) -> dict:
    strings = token_strings(tokenizer, token_ids)
    text_offset, pos = [], offset
    for s in strings:
        text_offset.append(pos)
        pos += len(s)
    return {
        "tokens": strings,
        "token_logprobs": list(logprobs),
        "top_logprobs": [{s: lp} for s, lp in zip(strings, logprobs)],
        "text_offset": text_offset,
    }


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[float], top: int) -> dict:
    content = []
    for s, lp in zip(token_strings(tokenizer, token_ids), logprobs):
        entry = {"token": s, "logprob": lp, "bytes": list(s.encode())}
        entry["top_logprobs"] = [dict(entry)] if top else []
        content.append(entry)
    return {"content": content}
