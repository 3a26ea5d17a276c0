"""Fake OpenAI backends on loopback that misbehave on purpose (for the router's fault tests): each answers
/health with 200 and /v1/completions as its mode says."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GOOD_JSON = {
    "id": "cmpl-1",
    "object": "text_completion",
    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
}
GOOD_EVENTS = [
    {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "o", "finish_reason": None}]},
    {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "k", "finish_reason": "stop"}]},
]
MODES = ("good", "garbage", "html500", "truncate", "reset", "hang", "not_openai", "dribble", "slow")


class _Handler(BaseHTTPRequestHandler):
    mode = "good"
    seen: list
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def _client_left_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
        return False

    def do_GET(self):
        if self.path.startswith("/v1/"):
            self.seen.append(("GET", self.path, self.headers.get("authorization")))
        if self.path == "/health":
            self._send(200, b"{}", "application/json")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode(), "application/json")
        else:
            self._send(200, b"", "text/plain")

    def do_POST(self):
        self.seen.append(("POST", self.path, self.headers.get("authorization")))
        length = int(self.headers.get("content-length", 0))
        stream = bool(json.loads(self.rfile.read(length) or b"{}").get("stream"))
        mode = self.mode
        if mode == "reset":
            self.connection.close()
            return
        if mode == "hang":  # /health answers, completions never do
            time.sleep(30)
            return
        if mode == "slow" and not stream:  # a long generation: note whether the caller hangs up meanwhile
            self.seen.append(("GONE", self.path, self._client_left_within(5.0)))
            return
        if mode == "html500":
            self._send(500, b"<html><body><h1>500 Internal Server Error</h1></body></html>", "text/html")
            return
        if mode == "not_openai":
            self._send(200, b'{"result": "something else"}', "application/json")
            return
        if not stream:
            if mode == "garbage":
                self._send(200, b"this is not json at all", "application/json")
            elif mode == "truncate":
                body = json.dumps(GOOD_JSON).encode()
                self._send(200, body[: len(body) // 2], "application/json", length=len(body))
            else:
                self._send(200, json.dumps(GOOD_JSON).encode(), "application/json")
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        if mode == "garbage":
            self.wfile.write(b"hello, this is not a stream\n\n")
        elif mode == "dribble":  # one event, then silence
            self.wfile.write(b"data: " + json.dumps(GOOD_EVENTS[0]).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(10)
        elif mode == "truncate":  # one good event, then the connection ends: no finish, no [DONE]
            self.wfile.write(b"data: " + json.dumps(GOOD_EVENTS[0]).encode() + b"\n\n")
        else:
            for event in GOOD_EVENTS:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")


class FakeBackend:
    """`with FakeBackend("garbage") as b: b.url`; serves on 127.0.0.1 in a daemon thread."""

    def __init__(self, mode: str = "good"):
        assert mode in MODES
        self.seen: list[tuple] = []  # (method, path, Authorization header) of each request but /health
        handler = type("Handler", (_Handler,), {"mode": mode, "seen": self.seen})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
