"""A request's engine outputs as streaming deltas, one choice at a time: the text each output adds to its
choice, its new tokens and their logprobs. Each choice's deltas concatenate to exactly its non-streamed text
(see detokenize.py). With n > 1 (testbed.sequence_group) each sequence's outputs carry its index and the
stream ends with the group's final output, which adds no tokens."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.detokenize import IncrementalDetokenizer
from testbed.outputs import CompletionOutput, RequestOutput
from testbed.sampling_params import SamplingParams
from testbed.server.async_engine import RequestStream


@dataclass
class ChoiceDelta:
    out: RequestOutput
    choice: CompletionOutput | None  # None: a group's final output (nothing new; the stream's end)
    text: str = ""
    new_token_ids: tuple | list = ()
    logprobs: tuple | list = ()  # of new_token_ids
    done: bool = False  # this choice has finished
    completion_tokens: int = 0  # over every choice so far (usage)


async def text_deltas(tokenizer, params: SamplingParams, stream: RequestStream):
    """A ChoiceDelta per engine output; the last one's out is finished."""
    detoks: dict[int, IncrementalDetokenizer] = {}
    num_tokens: dict[int, int] = {}
    group = params.num_sequences > 1
    async for out in stream:
        if group and out.finished:
            yield ChoiceDelta(out, None, completion_tokens=sum(num_tokens.values()))
            continue
        c = out.outputs[0]
        done = c.finish_reason is not None
        detok = detoks.get(c.index)
        if detok is None:
            detok = detoks[c.index] = IncrementalDetokenizer(tokenizer, params.stop)
        new = out.new_token_ids
        text = detok.add(new, emit=not done)
        if done:
            text += detok.finish(c.text)
        lps = c.logprobs[len(c.token_ids) - len(new) :] if (c.logprobs is not None and new) else []
        num_tokens[c.index] = len(c.token_ids)
        yield ChoiceDelta(out, c, text, new, lps, done, sum(num_tokens.values()))
