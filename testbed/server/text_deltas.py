"""A request's engine outputs as streaming deltas: the text each output adds, its new tokens and their
logprobs. The deltas concatenate to exactly the non-streamed text (see detokenize.py)."""

from __future__ import annotations

from testbed.detokenize import IncrementalDetokenizer
from testbed.sampling_params import SamplingParams
from testbed.server.async_engine import RequestStream


async def text_deltas(tokenizer, params: SamplingParams, stream: RequestStream):
    """(out, text delta, new token ids, their logprobs) per engine output; the last one is finished."""
    detok = IncrementalDetokenizer(tokenizer, params.stop)
    async for out in stream:
        c = out.outputs[0]
        new = out.new_token_ids
        text = detok.add(new, emit=not out.finished)
        if out.finished:
            text += detok.finish(c.text)
        lps = c.logprobs[len(c.token_ids) - len(new) :] if (c.logprobs is not None and new) else []
        yield out, text, new, lps
