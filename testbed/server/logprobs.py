"""Logprobs in OpenAI's two shapes, from the engine's entries ({token id: Logprob} per position, the
scored token first, then the k most likely: testbed.executor.logprobs).

Completions (legacy): parallel lists; top_logprobs[i] maps each token string of the entry (the chosen
token and the k most likely, as OpenAI and vLLM do) to its logprob; None for the first echoed prompt
token, which has no logprob. Chat: one object per token with its k most likely tokens, by rank.
-inf (a token a constraint excluded) is reported as -9999.0, as vLLM does (JSON has no infinity).
"""

from __future__ import annotations

from collections.abc import Sequence

from testbed.detokenize import token_strings

FLOOR = -9999.0


def _lp(value: float) -> float:
    return max(value, FLOOR)


def completion_logprobs(tokenizer, token_ids: list[int], entries: Sequence[dict | None], offset: int) -> dict:
    strings = token_strings(tokenizer, token_ids)
    text_offset: list[int] = []
    pos = offset
    for s in strings:
        text_offset.append(pos)
        pos += len(s)
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict | None] = []
    for token, entry in zip(token_ids, entries):
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_lp(entry[token].logprob))
        names = token_strings(tokenizer, list(entry))
        top_logprobs.append({name: _lp(lp.logprob) for name, lp in zip(names, entry.values())})
    return {
        "tokens": strings,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def _chat_entry(name: str, logprob: float) -> dict:
    return {"token": name, "logprob": _lp(logprob), "bytes": list(name.encode())}


def chat_logprobs(tokenizer, token_ids: list[int], entries: list[dict], top: int) -> dict:
    content: list[dict] = []
    for token, name, entry in zip(token_ids, token_strings(tokenizer, token_ids), entries):
        item = _chat_entry(name, entry[token].logprob)
        best = sorted((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= top)
        best = best[:top]
        names = token_strings(tokenizer, [tid for _, tid, _ in best])
        item["top_logprobs"] = [_chat_entry(n, lp) for n, (_, _, lp) in zip(names, best)]
        content.append(item)
    return {"content": content}


def prompt_logprobs_json(tokenizer, entries: list[dict | None]) -> list[dict | None]:
    """vLLM's `prompt_logprobs` field: per prompt token None (the first) or {token id: {logprob, rank,
    decoded_token}}, the prompt token first, then the k most likely."""
    out: list[dict | None] = []
    for entry in entries:
        if entry is None:
            out.append(None)
            continue
        names = token_strings(tokenizer, list(entry))
        out.append(
            {
                str(tid): {"logprob": _lp(lp.logprob), "rank": lp.rank, "decoded_token": name}
                for (tid, lp), name in zip(entry.items(), names)
            }
        )
    return out
