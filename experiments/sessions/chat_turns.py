"""How a chat turn's text becomes the token ids appended to a session's history.

A session's history is the engine's exact tokens: turn k's prompt, then the ids the engine generated for
it, then turn k+1's new ids. With the chat template (`trace.chat_template=true`), the new ids are what the
template adds for one more user turn, so the history reads as the chat a chat service would have sent:

- turn 0: the template's whole prompt for the first user message, generation prompt included (as
  /v1/chat/completions renders a one-message chat: default system prompt, BOS, role headers);
- turn k > 0: the template's tokens after an assistant message: the assistant turn's end, the user
  message with its header, the generation prompt. They are computed once per tokenizer as a difference:
  tokens of the chat [user X, assistant Y, user M] with the generation prompt, less the tokens of
  [user X, assistant Y] rendered up to Y's content (`continue_final_message`); the first must extend the
  second token for token, or the template is refused (a template whose turn end merges with the answer's
  last token cannot be appended to an answer the template did not write).

The engine's answer stands in for Y as generated (with ignore_eos it has no end-of-turn token, which the
appended ids supply). What differs from re-rendering the whole chat each turn (what a client sending
`messages` to /v1/chat/completions gets): the answer is the engine's tokens, not a re-tokenization of its
text, and a template that rewrites earlier turns (drops past reasoning, dates each turn) is applied only to
the new turn. Without the template (`trace.chat_template=false`), a turn's ids are its message's text
encoded alone (BOS on turn 0 only), as the single-turn ShareGPT loader encodes prompts.

`tokenizer` is anything with `encode(text, add_special_tokens)` and, for the template,
`encode_chat(messages, add_generation_prompt, continue_final_message)`: LocalChat wraps an HF tokenizer the
way the server renders chats (testbed.server.tools.render, no tools); over HTTP, ServerTokenizer
(experiments.sessions.server_tokenizer) asks the server's /tokenize, so the ids are the served model's.
"""

from __future__ import annotations

from experiments.traces.types import TraceError

# stand-ins for the earlier turns: only what the template puts between an assistant message and the next
# user message's generation prompt is kept
_USER, _ANSWER = "Hello.", "Hi there."


class LocalChat:
    """An HF tokenizer with encode_chat rendered as the server renders a chat without tools."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except TypeError:  # tokenizers without the HF keyword
            return list(self.tokenizer.encode(text))

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise TraceError(
                "the tokenizer has no chat template (set trace.chat_template=false to encode messages alone)",
                "trace config",
                field="chat_template",
            )
        kwargs = {"continue_final_message": True} if continue_final_message else {}
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def chat_tokenizer(tokenizer):
    """tokenizer as it is if it already renders chats (ServerTokenizer), else wrapped in LocalChat."""
    return tokenizer if hasattr(tokenizer, "encode_chat") else LocalChat(tokenizer)


class TurnEncoder:
    """turn_ids(text, k): the ids turn k's user message appends to the history (see the module docstring)."""

    def __init__(self, tokenizer, chat_template: bool):
        self.tok = chat_tokenizer(tokenizer)
        self.chat_template = chat_template
        self._before: list[int] | None = None  # [user X, assistant Y] up to Y's content

    def turn_ids(self, text: str, k: int) -> list[int]:
        if not self.chat_template:
            ids = self.tok.encode(text, add_special_tokens=k == 0)
            return ids or self.tok.encode(" ", add_special_tokens=False)[:1]
        if k == 0:
            return self.tok.encode_chat([{"role": "user", "content": text}], True, False)
        if self._before is None:
            self._before = self.tok.encode_chat(
                [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER}], False, True
            )
        chat = [
            {"role": "user", "content": _USER},
            {"role": "assistant", "content": _ANSWER},
            {"role": "user", "content": text},
        ]
        after = self.tok.encode_chat(chat, True, False)
        n = len(self._before)
        if after[:n] != self._before:
            raise TraceError(
                "the chat template's next turn does not extend the assistant's message token for token, so "
                "it cannot be appended to the engine's answer (set trace.chat_template=false)",
                "trace config",
                field="chat_template",
            )
        return after[n:]

    def answer_len(self, text: str) -> int:
        """The recorded reply's length in tokens (its text alone)."""
        return max(1, len(self.tok.encode(text, add_special_tokens=False)))
