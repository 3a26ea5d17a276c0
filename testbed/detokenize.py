"""Incremental detokenization for streamed text deltas.

The engine fills a request's text only when it finishes: `decode(output_ids, skip_special_tokens=True)`,
cut at the first stop string. Streaming needs the text as it grows, without re-decoding everything per
token and without emitting half a UTF-8 character (byte-level BPE splits multi-byte characters across
tokens, which decode to U+FFFD until complete). vLLM's offsets scheme: decode a short window ending at
the new token and keep what it adds beyond the window's already-read part.

Stop strings: the last len(longest stop) - 1 characters are held back, so a stop string that is still
forming is never sent; since the engine ends a request as soon as a stop string appears, everything
sent is a prefix of the final text. `finish(final_text)` returns the rest, so the deltas always
concatenate to exactly the non-streamed text.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: list[str] | tuple[str, ...] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens before this are already in self.text
        self.text = ""  # decoded so far (complete characters only)
        self.sent = 0  # characters of self.text already handed out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_token_ids: list[int], emit: bool = True) -> str:
        """Append tokens; return the text that is now safe to send ("" if none).

        emit=False for a request's last output: its text may run past a stop string, so the rest
        comes from `finish(final_text)` instead."""
        if self.tokenizer is None:
            return ""
        for token in new_token_ids:
            self.token_ids.append(token)
            prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
            new_text = self._decode(self.token_ids[self.prefix_offset :])
            if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
                self.text += new_text[len(prefix_text) :]
                self.prefix_offset = self.read_offset
                self.read_offset = len(self.token_ids)
        upto = len(self.text) - self.holdback
        if not emit or upto <= self.sent:
            return ""
        delta = self.text[self.sent : upto]
        self.sent = upto
        return delta

    def finish(self, final_text: str | None) -> str:
        """The remaining text once the engine gives the final text (None/"" without a tokenizer)."""
        if self.tokenizer is None or final_text is None:
            return ""
        sent = self.text[: self.sent]
        if not final_text.startswith(sent):
            # should not happen (see the module docstring); never resend what the client already has
            logger.warning("streamed text %r is not a prefix of the final text %r", sent[-40:], final_text[-40:])
            return final_text[self.sent :] if len(final_text) > self.sent else ""
        self.sent = len(final_text)
        return final_text[len(sent) :]


def token_strings(tokenizer, token_ids: list[int]) -> list[str]:
    """Printable per-token strings for logprobs (token_id:N without a tokenizer, as vLLM does)."""
    if tokenizer is None:
        return [f"token_id:{t}" for t in token_ids]
    return [tokenizer.decode([t]) for t in token_ids]
