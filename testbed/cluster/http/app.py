"""The HTTP router: an OpenAI-compatible front end that sends each request to one backend (testbed-serve
or any vLLM-compatible server) chosen by a router policy, relaying the answer as it comes (streams too).

    POST /v1/completions, /v1/chat/completions   proxied (body and Authorization header as sent)
    GET  /v1/models                              from a healthy backend (Authorization header as sent)
    POST /tokenize, /detokenize                  vLLM's tokenizer endpoints, from the least busy healthy
                                                 backend (stateless: not routed by prefix, not counted in
                                                 a backend's outstanding requests)
    GET  /health                                 200 while some backend is healthy, else 503; counts only
                                                 (?detail=true: each backend's URL and last error, behind
                                                 the api key when there is one)
    GET  /metrics                                the router's own series, backends by position in
                                                 cluster.backends (testbed.cluster.http.metrics)

The router enforces server.api_key as the server does (testbed.server.auth: constant-time, the same 401
body), refuses bodies over server.max_body_bytes with 413 once, before any backend sees them, and slow
heads and bodies as the server does (server.header_timeout_s, server.body_timeout_s); a malformed or
too deeply nested JSON body is an OpenAI-style 400 (testbed.server.json_body).

Failures: a backend that cannot be reached before it answers (connection refused or reset, no response)
is counted against its health and the request is sent to another backend (each at most once), so
requests keep flowing when a backend dies. Answers are checked before they are relayed
(relay_checks.py): a whole answer that is not OpenAI-shaped JSON, or a stream whose first chunk is not
server-sent events, is counted as a bad answer and the request is sent to another backend (nothing was
relayed yet), or answered 502 naming the backend when none is left; a backend that fails or sends garbage
after it started answering ends that response with a clear error (a stream gets an OpenAI-style
`data: {"error": ...}` event, then `data: [DONE]`; a stream that ends without [DONE] gets one too); with
no healthy backend left the answer is 503. Every response names its backend in the
`x-testbed-backend` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from testbed.cluster.http.backends import Backend, BackendPool
from testbed.cluster.http.metrics import RouterMetrics
from testbed.cluster.http.relay_checks import StreamCheck, answer_problem
from testbed.cluster.prefix import leading_block_hashes, text_block_hashes
from testbed.cluster.routers import NoHealthyReplica, ReplicaSnapshot, Router, RouteRequest
from testbed.server.auth import api_key_check
from testbed.server.body_limits import BodyLimits
from testbed.server.error_handlers import add_error_handlers
from testbed.server.json_body import parse_json_object
from testbed.server.settings import ServerSettings

ROUTE_BLOCK_TOKENS = 16  # token-id prompts are hashed in blocks of this many tokens (the engine's default)
# an answer that fails before its first byte can be re-sent elsewhere; nothing was relayed yet
NOT_ANSWERED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)


def error_response(message: str, status: int, type_: str = "server_error") -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": None, "code": str(status)}}
    return JSONResponse(body, status_code=status)


def stream_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "backend_error", "param": None, "code": "502"}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


def route_request(payload: dict) -> RouteRequest:
    """What a router sees of an OpenAI request: its leading blocks (token ids or text) and length."""
    prompt = payload.get("prompt") if "prompt" in payload else payload.get("messages")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of prompts goes where its first would
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return RouteRequest("http", len(prompt), leading_block_hashes(prompt, ROUTE_BLOCK_TOKENS))
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return RouteRequest("http", len(text), text_block_hashes(text))


class Proxy:
    def __init__(
        self,
        pool: BackendPool,
        router: Router,
        metrics: RouterMetrics,
        request_timeout_s: float,
        stall_timeout_s: float | None = None,
    ):
        self.pool, self.router, self.metrics = pool, router, metrics
        self.request_timeout_s = request_timeout_s
        # a whole answer may take request_timeout_s; a stream may pause at most stall_timeout_s between chunks
        self.timeout = httpx.Timeout(request_timeout_s, connect=pool.probe_timeout_s)
        self.stream_timeout = httpx.Timeout(stall_timeout_s or request_timeout_s, connect=pool.probe_timeout_s)
        self.client: httpx.AsyncClient | None = None  # opened with the app (its lifespan)

    @property
    def http(self) -> httpx.AsyncClient:
        if self.client is None:
            raise RuntimeError("the router's HTTP client opens with the app: serve it (its lifespan runs first)")
        return self.client

    def choose(self, request: RouteRequest, tried: set[int]) -> Backend:
        views = [
            ReplicaSnapshot(
                b.index,
                b.outstanding,
                b.running,
                b.waiting,
                b.free_blocks,
                b.total_blocks,
                b.healthy and b.index not in tried,
                b.prefixes,
            )  # fmt: skip
            for b in self.pool.backends
        ]
        return self.pool.backends[self.router.route(request, views)]

    async def forward(self, request: Request, path: str):
        started = time.monotonic()
        body = await request.body()  # within server.max_body_bytes (BodyLimits), read once for every backend
        payload = parse_json_object(body)  # APIError (an OpenAI-style 400) when malformed or nested too deeply
        stream = bool(payload.get("stream"))
        route = route_request(payload)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        tried: set[int] = set()
        last_bad: JSONResponse | None = None  # a malformed answer's 502, if no other backend is left
        while True:
            try:
                backend = self.choose(route, tried)
            except NoHealthyReplica:
                if last_bad is not None:
                    return last_bad
                self.metrics.no_backend.inc()
                n = len(self.pool.backends)
                return error_response(f"no healthy backend (of {n}; GET /health?detail=true says why)", 503)
            backend.outstanding += 1
            backend.prefixes.add(route.block_hashes)
            url = f"{backend.url}{path}"
            try:
                timeout = self.stream_timeout if stream else self.timeout
                sent = self.http.send(
                    self.http.build_request("POST", url, content=body, headers=headers, timeout=timeout),
                    stream=True,
                )
                # a whole answer's head comes when it is done: stop waiting (and close the backend's
                # connection, which aborts its work) if the client leaves first
                upstream = await sent if stream else await until_client_leaves(request, sent)
            except ClientGone:
                backend.outstanding -= 1
                self.metrics.requests.labels(self.metrics.label(backend), "client_gone").inc()
                return Response(status_code=499)
            except httpx.TimeoutException as e:  # nothing relayed yet: another backend may answer
                last_bad = self.bad(backend, f"no answer within {timeout.read:g} s ({type(e).__name__})", tried)
                last_bad.status_code = 504
                continue
            except NOT_ANSWERED as e:
                backend.outstanding -= 1
                self.pool.failure(backend, f"{type(e).__name__}: {e}")
                if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):  # took it, then dropped it
                    self.pool.bad_answer(backend, f"{type(e).__name__}: {e}")
                self.metrics.retries.labels(self.metrics.label(backend)).inc()
                tried.add(backend.index)
                continue
            except httpx.HTTPError as e:
                backend.outstanding -= 1
                self.pool.failure(backend, f"{type(e).__name__}: {e}")
                self.metrics.requests.labels(self.metrics.label(backend), "error").inc()
                return error_response(f"backend {backend.url} failed: {type(e).__name__}: {e}", 502)
            relay_headers = {"x-testbed-backend": backend.url}
            if stream and upstream.status_code == 200:
                opened = await self.open_stream(upstream, backend)
                if isinstance(opened, str):  # nothing relayed yet: try another backend
                    last_bad = self.bad(backend, opened, tried)
                    continue
                self.pool.success(backend)
                return StreamingResponse(
                    self.relay(upstream, backend, started, *opened),
                    media_type="text/event-stream",
                    headers=relay_headers,
                )
            try:
                content = await upstream.aread()
            except httpx.HTTPError as e:
                self.pool.failure(backend, f"{type(e).__name__}: {e}")
                self.metrics.requests.labels(self.metrics.label(backend), "error").inc()
                return error_response(f"backend {backend.url} failed mid-answer: {type(e).__name__}: {e}", 502)
            finally:
                await upstream.aclose()
                backend.outstanding -= 1
            problem = answer_problem(upstream.status_code, content)
            if problem is not None:
                backend.outstanding += 1  # bad() settles it
                last_bad = self.bad(backend, problem, tried)
                continue
            self.pool.success(backend)
            self.metrics.requests.labels(self.metrics.label(backend), str(upstream.status_code)).inc()
            self.metrics.duration.labels(self.metrics.label(backend)).observe(time.monotonic() - started)
            media = upstream.headers.get("content-type", "application/json")
            return Response(content, status_code=upstream.status_code, media_type=media, headers=relay_headers)

    def bad(self, backend: Backend, problem: str, tried: set[int]) -> JSONResponse:
        """Count a malformed answer against the backend; the 502 the client gets if no other is left."""
        backend.outstanding -= 1
        self.pool.bad_answer(backend, problem)
        self.metrics.requests.labels(self.metrics.label(backend), "bad_answer").inc()
        self.metrics.retries.labels(self.metrics.label(backend)).inc()
        tried.add(backend.index)
        return error_response(f"backend {backend.url} sent a malformed answer: {problem}", 502, "backend_error")

    async def open_stream(self, upstream: httpx.Response, backend: Backend):
        """The stream's iterator, first chunk and check; or why it is unusable (closed then)."""
        chunks = upstream.aiter_raw()
        check = StreamCheck()
        first, problem = b"", None
        try:
            while not first and problem is None:  # up to the first whole event
                chunk = await anext(chunks, None)
                if chunk is None:
                    problem = check.end_problem()
                    break
                first = check.feed(chunk)
                problem = check.problem
        except httpx.HTTPError as e:
            problem = f"failed before its first event: {type(e).__name__}: {e}"
        if problem is not None:
            await upstream.aclose()
            return problem
        return chunks, first, check

    async def relay(self, upstream: httpx.Response, backend: Backend, started: float, chunks, first, check):
        outcome = "200"
        try:
            yield first
            async for chunk in chunks:
                events = check.feed(chunk)
                if events:
                    yield events
                if check.problem is not None:
                    break
                if time.monotonic() - started > self.request_timeout_s:
                    check.problem = f"the stream ran past the router's deadline of {self.request_timeout_s:g} s"
                    break
            problem = check.end_problem()
            if problem is not None:
                outcome = "bad_stream"
                self.pool.bad_answer(backend, problem)
                yield stream_error(f"backend {backend.url} sent a malformed stream: {problem}")
        except httpx.HTTPError as e:
            outcome = "stream_error"
            self.pool.failure(backend, f"{type(e).__name__}: {e}")
            yield stream_error(f"backend {backend.url} failed mid-stream: {type(e).__name__}: {e}")
        finally:
            await upstream.aclose()
            backend.outstanding -= 1
            self.metrics.requests.labels(self.metrics.label(backend), outcome).inc()
            self.metrics.duration.labels(self.metrics.label(backend)).observe(time.monotonic() - started)

    async def tokenizer(self, request: Request, path: str):
        """/tokenize or /detokenize from a healthy backend (the one with the fewest outstanding requests);
        one that cannot be reached or answers garbage is counted against and the next is asked."""
        started = time.monotonic()
        body = await request.body()
        parse_json_object(body)  # a malformed body is an OpenAI-style 400 before any backend sees it
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        tried: set[int] = set()
        last_bad: JSONResponse | None = None
        while True:
            live = [b for b in self.pool.backends if b.healthy and b.index not in tried]
            if not live:
                if last_bad is not None:
                    return last_bad
                self.metrics.no_backend.inc()
                return error_response(f"no healthy backend (of {len(self.pool.backends)})", 503)
            backend = min(live, key=lambda b: b.outstanding)
            tried.add(backend.index)
            label = self.metrics.label(backend)
            try:
                upstream = await self.http.post(f"{backend.url}{path}", content=body, headers=headers)
            except (httpx.TimeoutException, *NOT_ANSWERED) as e:
                self.pool.failure(backend, f"{type(e).__name__}: {e}")
                self.metrics.retries.labels(label).inc()
                continue
            except httpx.HTTPError as e:
                self.pool.failure(backend, f"{type(e).__name__}: {e}")
                self.metrics.requests.labels(label, "error").inc()
                return error_response(f"backend {backend.url} failed: {type(e).__name__}: {e}", 502)
            problem = answer_problem(upstream.status_code, upstream.content, path)
            if problem is not None:
                self.pool.bad_answer(backend, problem)
                self.metrics.requests.labels(label, "bad_answer").inc()
                self.metrics.retries.labels(label).inc()
                last_bad = error_response(f"backend {backend.url} sent a malformed answer: {problem}", 502,
                                          "backend_error")  # fmt: skip
                continue
            self.pool.success(backend)
            self.metrics.requests.labels(label, str(upstream.status_code)).inc()
            self.metrics.duration.labels(label).observe(time.monotonic() - started)
            return Response(upstream.content, upstream.status_code, media_type="application/json",
                            headers={"x-testbed-backend": backend.url})  # fmt: skip

    async def models(self, request: Request):
        headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
        for backend in self.pool.backends:
            if backend.healthy:
                try:
                    upstream = await self.http.get(
                        f"{backend.url}/v1/models", headers=headers, timeout=self.pool.probe_timeout_s
                    )
                except httpx.HTTPError as e:
                    self.pool.failure(backend, f"{type(e).__name__}: {e}")
                    continue
                return Response(upstream.content, upstream.status_code, media_type="application/json")
        return error_response("no healthy backend", 503)


class ClientGone(Exception):
    """The client disconnected before its answer came."""


async def until_client_leaves(request: Request, awaitable, poll_s: float = 0.25):
    """The awaitable's result; ClientGone (the awaitable cancelled) once the client has disconnected."""
    task = asyncio.ensure_future(awaitable)
    while True:
        done, _ = await asyncio.wait({task}, timeout=poll_s)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task
            raise ClientGone


def build_router_app(pool: BackendPool, router: Router, metrics: RouterMetrics, probe_interval_s: float,
                     request_timeout_s: float, settings: ServerSettings | None = None,
                     stall_timeout_s: float | None = None) -> FastAPI:  # fmt: skip
    proxy = Proxy(pool, router, metrics, request_timeout_s, stall_timeout_s)
    settings = settings or ServerSettings()
    check_key = api_key_check(settings.api_key)
    auth = [Depends(check_key)]

    @asynccontextmanager
    async def lifespan(app):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=proxy.timeout, limits=limits) as client:
            proxy.client = client
            await pool.probe_all(client)  # know who is up before the first request
            probes = asyncio.create_task(pool.probe_forever(client, probe_interval_s))
            try:
                yield
            finally:
                probes.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probes

    app = FastAPI(title="testbed router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pool = pool
    add_error_handlers(app)
    app.add_middleware(BodyLimits, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        return await proxy.forward(request, "/v1/completions")

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat(request: Request):
        return await proxy.forward(request, "/v1/chat/completions")

    @app.get("/v1/models", dependencies=auth)
    async def models(request: Request):
        return await proxy.models(request)

    @app.post("/tokenize", dependencies=auth)
    async def tokenize(request: Request):
        return await proxy.tokenizer(request, "/tokenize")

    @app.post("/detokenize", dependencies=auth)
    async def detokenize(request: Request):
        return await proxy.tokenizer(request, "/detokenize")

    @app.get("/health")
    async def health(request: Request, detail: bool = False):
        healthy = sum(b.healthy for b in pool.backends)
        answer: dict = {
            "status": "ok" if healthy else "no healthy backend",
            "healthy_backends": healthy,
            "num_backends": len(pool.backends),
        }
        if detail:  # backend URLs and their errors: only for whoever holds the key
            await check_key(request)
            answer["backends"] = [
                {
                    "index": b.index,
                    "url": b.url,
                    "healthy": b.healthy,
                    "outstanding": b.outstanding,
                    "last_error": b.last_error,
                }
                for b in pool.backends
            ]
        return JSONResponse(answer, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics_page():
        body, content_type = metrics.render(pool.backends)
        return Response(body, media_type=content_type)

    return app
