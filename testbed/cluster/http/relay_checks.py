"""What the router checks in a backend's answer before relaying it: a whole answer must be a JSON object in
OpenAI's shape (200: `choices` or a `list` object, /tokenize's `tokens`, /detokenize's `prompt`; an error
status: an `error` object), a stream must be
server-sent events whose `data:` payloads are JSON objects, ending with `data: [DONE]`. Anything else (an
HTML error page, garbage, a truncated stream) is the backend's fault: the client gets a 502 or an error
event naming the backend, never the garbage."""

from __future__ import annotations

import json

SSE_FIELDS = (b"event", b"id", b"retry")
# vLLM's tokenizer endpoints: the field a 200 answer must carry, and its type
TOKENIZER_ANSWERS = {"/tokenize": ("tokens", list), "/detokenize": ("prompt", str)}


def answer_problem(status: int, body: bytes, path: str | None = None) -> str | None:
    """Why this whole answer to `path` is not a well-formed OpenAI (or vLLM tokenizer) answer, or None."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"a non-JSON {status} body ({len(body)} bytes, starting {body[:40]!r})"
    if not isinstance(data, dict):
        return f"a {status} body that is JSON but not an object"
    if status == 200 and path in TOKENIZER_ANSWERS:
        key, kind = TOKENIZER_ANSWERS[path]
        if not isinstance(data.get(key), kind):
            return f"a 200 body without `{key}`"
    elif status == 200:
        if not isinstance(data.get("choices"), list) and data.get("object") != "list":
            return "a 200 body without `choices`"
    elif not isinstance(data.get("error"), dict):
        return f"a {status} body without an OpenAI `error` object"
    return None


class StreamCheck:
    """Follows a server-sent event stream chunk by chunk: `feed` returns the complete, well-formed events
    to relay (a partial one waits for its end); `problem` is set at the first malformed event, `done` once
    `data: [DONE]` has arrived."""

    def __init__(self):
        self._buffer = b""
        self.done = False
        self.events = 0
        self.problem: str | None = None

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        start = self._buffer.lstrip()
        if len(start) >= 6 and not start.startswith((b"data:", b":", b"event:", b"id:", b"retry:")):
            self.problem = f"a line that is not server-sent events: {start[:40]!r}"
        good = []
        while self.problem is None and b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                self._line(line)
            if self.problem is None:
                good.append(event + b"\n\n")
        return b"".join(good)

    def _line(self, line: bytes) -> None:
        if not line or line.startswith(b":"):  # blank, or an SSE comment
            return
        name, _, value = line.partition(b":")
        if name in SSE_FIELDS:
            return
        if name != b"data":
            self.problem = f"a line that is not server-sent events: {line[:40]!r}"
            return
        payload = value.strip()
        if self.done:
            self.problem = "data after [DONE]"
        elif payload == b"[DONE]":
            self.done = True
        else:
            try:
                ok = isinstance(json.loads(payload), dict)
            except (ValueError, UnicodeDecodeError):
                ok = False
            if not ok:
                self.problem = f"an event that is not a JSON object: {payload[:40]!r}"
            self.events += 1

    def end_problem(self) -> str | None:
        """At the end of the stream: what was wrong with it, or None."""
        if self.problem is not None:
            return self.problem
        if self._buffer.strip():
            return f"the stream ended inside an event: {self._buffer[:40]!r}"
        return None if self.done else "the stream ended without data: [DONE]"
