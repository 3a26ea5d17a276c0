"""OpenAI-compatible HTTP server over one Engine (FastAPI + uvicorn).

    python run.py mode=serve server.host=127.0.0.1 server.port=8000 [server.api_key=KEY]
    testbed-serve --port 8000 --api-key KEY model=tiny          # the console script: same, plus flags

Routes: POST /v1/completions, POST /v1/chat/completions (stream: true -> server-sent events in
OpenAI's chunk format, ending with `data: [DONE]`), GET /v1/models, GET /health, GET /metrics.
Bad input is an OpenAI-style error body: 400 (404 for an unknown route or model, 401 without the
API key, 503 when the waiting queue is full or the server is draining).

SIGTERM/SIGINT: stop accepting, let in-flight requests finish (up to server.graceful_timeout_s), then
abort what is left, stop the stepping thread and return.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import secrets
import signal
import socket
import sys
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from testbed.sampling_params import SamplingParams
from testbed.server import protocol as P
from testbed.server.async_engine import AsyncEngine, EngineError, QueueFullError, ShuttingDownError
from testbed.server.detokenize import IncrementalDetokenizer, token_strings
from testbed.server.metrics import ServerMetrics

logger = logging.getLogger("testbed.server")


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_waiting: int = 1024             # waiting requests beyond this get 503
    graceful_timeout_s: float = 30.0    # on SIGTERM: wait this long for in-flight requests, then abort them
    served_model_name: str | None = None   # None: the engine's (= the config's) model name
    log_level: str = "info"
    access_log: bool = False

    @classmethod
    def from_cfg(cls, cfg: Any = None, **overrides) -> ServerSettings:
        values = {}
        if cfg is not None:
            try:
                from omegaconf import DictConfig, OmegaConf
                if isinstance(cfg, DictConfig):
                    cfg = OmegaConf.to_container(cfg, resolve=True)
            except ImportError:        # pragma: no cover
                pass
            values.update(dict(cfg))
        values.update(overrides)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown server settings {unknown}; known: {sorted(names)}")
        settings = cls(**values)
        if settings.api_key == "":
            settings.api_key = None
        if not 0 <= int(settings.port) <= 65535:
            raise ValueError(f"server.port must be in [0, 65535], got {settings.port}")
        if settings.max_waiting < 1:
            raise ValueError(f"server.max_waiting must be >= 1, got {settings.max_waiting}")
        return settings


# ---- responses ---------------------------------------------------------------------------------------
def _error_response(err: P.APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status_code == 503 else None
    return JSONResponse(err.body(), status_code=err.status_code, headers=headers)


def _sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


class SSEResponse(StreamingResponse):
    """A streaming response that runs `on_close` however it ends (done, client gone, cancelled).

    The body generator alone is not enough: if the client leaves before the first chunk, the
    generator never starts and its `finally` never runs."""

    def __init__(self, content, on_close, **kwargs):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _own_copy(tokenizer):
    """The event loop's own tokenizer: the stepping thread decodes with the engine's (stop strings, final
    text), and a Rust tokenizer used from two threads at once can fail ("Already borrowed")."""
    if tokenizer is None:
        return None
    try:
        return copy.deepcopy(tokenizer)
    except Exception:                    # not copyable: share it (plain encode/decode do not mutate it)
        logger.warning("could not copy the tokenizer; sharing the engine's")
        return tokenizer


# ---- the app -----------------------------------------------------------------------------------------
class OpenAIServer:
    """Request handling: parse, tokenize, admit, then answer whole or as a stream."""

    def __init__(self, async_engine: AsyncEngine, settings: ServerSettings):
        self.ae = async_engine
        self.engine = async_engine.engine
        self.settings = settings
        self.model_name = settings.served_model_name or self.engine.model_name
        self.tokenizer = _own_copy(self.engine.tokenizer)
        self.max_model_len = self.engine.max_model_len
        self.created = int(time.time())
        # regular vocabulary (no added/special ids) where there is a tokenizer: what traces may draw from
        self.vocab_size = getattr(self.tokenizer, "vocab_size", None) or self.engine.arch.vocab_size

    def model_list(self) -> dict:
        return P.model_list(self.model_name, self.created, self.max_model_len, self.vocab_size)

    # -- parsing
    async def parse(self, request: Request, model_cls):
        body = await request.body()
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise P.APIError(f"malformed JSON body: {e}", 400, code="invalid_json")
        if not isinstance(data, dict):
            raise P.APIError(f"the body must be a JSON object, got {type(data).__name__}", 400)
        try:
            req = model_cls.model_validate(data)
        except ValidationError as e:
            raise P.validation_error_to_api_error(e)
        if req.model != self.model_name:
            raise P.APIError(f"The model `{req.model}` does not exist (this server serves `{self.model_name}`).",
                             404, "invalid_request_error", "model", "model_not_found")
        return req

    def sampling_params(self, req) -> SamplingParams:
        try:
            return req.to_sampling_params()
        except ValueError as e:
            raise P.APIError(str(e), 400, param=None, code="invalid_value")

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise P.APIError(f"model `{self.model_name}` has no tokenizer: send the prompt as a list of token ids",
                             400, param="prompt")
        return self.tokenizer.encode(prompt)

    def chat_prompt(self, req: P.ChatCompletionRequest) -> list[int]:
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            raise P.APIError(f"model `{self.model_name}` has no chat template", 400, param="messages")
        try:
            text = tok.apply_chat_template(req.conversation(), add_generation_prompt=req.add_generation_prompt,
                                           tokenize=False)
        except Exception as e:           # template errors (e.g. a role it rejects) are the caller's
            raise P.APIError(f"the chat template rejected the messages: {e}", 400, param="messages")
        return tok.encode(text, add_special_tokens=False)

    def admit(self, prompt_ids: list[int], params: SamplingParams, rid: str, arrival: float, priority: int = 0):
        n = len(prompt_ids)
        if params.max_tokens is not None and n + params.max_tokens > self.max_model_len:
            raise P.APIError(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                             f"requested {n + params.max_tokens} tokens ({n} in the prompt, {params.max_tokens} "
                             f"in the completion). Please reduce the prompt or max_tokens.", 400,
                             param="prompt" if n >= self.max_model_len else "max_tokens",
                             code="context_length_exceeded")
        try:
            return self.ae.add_request(prompt_ids, params, rid, arrival, priority)
        except ValueError as e:
            raise P.APIError(str(e), 400, param="prompt", code="invalid_prompt")
        except QueueFullError as e:
            raise P.APIError(str(e), 503, "service_unavailable_error", code="queue_full")
        except ShuttingDownError as e:
            raise P.APIError(str(e), 503, "service_unavailable_error", code="shutting_down")

    # -- logprobs
    def completion_logprobs(self, token_ids: list[int], logprobs: list[float], offset: int) -> dict:
        strings = token_strings(self.tokenizer, token_ids)
        text_offset, pos = [], offset
        for s in strings:
            text_offset.append(pos)
            pos += len(s)
        return {"tokens": strings, "token_logprobs": list(logprobs),
                "top_logprobs": [{s: lp} for s, lp in zip(strings, logprobs)], "text_offset": text_offset}

    def chat_logprobs(self, token_ids: list[int], logprobs: list[float], top: int) -> dict:
        content = []
        for s, lp in zip(token_strings(self.tokenizer, token_ids), logprobs):
            entry = {"token": s, "logprob": lp, "bytes": list(s.encode())}
            entry["top_logprobs"] = [dict(entry)] if top else []
            content.append(entry)
        return {"content": content}

    # -- whole responses
    async def collect(self, stream, request: Request):
        """The finished output, or None if the client went away (the request is then aborted)."""
        async def drain():
            last = None
            async for out in stream:
                last = out
            return last
        consumer = asyncio.ensure_future(drain())
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if consumer in done:
                return consumer.result()
            consumer.cancel()
            return None
        finally:
            watcher.cancel()
            stream.abort()

    async def completions(self, request: Request):
        arrival = self.engine.clock()
        req = await self.parse(request, P.CompletionRequest)
        params = self.sampling_params(req)
        prompt = req.single_prompt()
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        rid, created = P.random_id("cmpl"), P.now_s()
        stream = self.admit(prompt_ids, params, rid, arrival, req.priority)
        if req.stream:
            return SSEResponse(self.completion_events(req, params, stream, rid, created, len(prompt_ids)),
                               stream.abort)
        out = await self.collect(stream, request)
        if out is None:
            return Response(status_code=499)
        c = out.outputs[0]
        lp = self.completion_logprobs(c.token_ids, c.logprobs or [], 0) if params.logprobs is not None else None
        return JSONResponse(P.completion_response(rid, created, self.model_name, c.text, c.finish_reason, lp,
                                                  P.usage(len(prompt_ids), len(c.token_ids)), c.stop_reason))

    async def chat(self, request: Request):
        arrival = self.engine.clock()
        req = await self.parse(request, P.ChatCompletionRequest)
        params = self.sampling_params(req)
        prompt_ids = self.chat_prompt(req)
        rid, created = P.random_id("chatcmpl"), P.now_s()
        stream = self.admit(prompt_ids, params, rid, arrival, req.priority)
        if req.stream:
            return SSEResponse(self.chat_events(req, params, stream, rid, created, len(prompt_ids)), stream.abort)
        out = await self.collect(stream, request)
        if out is None:
            return Response(status_code=499)
        c = out.outputs[0]
        lp = self.chat_logprobs(c.token_ids, c.logprobs or [], req.top_logprobs or 0) if req.logprobs else None
        return JSONResponse(P.chat_response(rid, created, self.model_name, c.text, c.finish_reason, lp,
                                            P.usage(len(prompt_ids), len(c.token_ids)), c.stop_reason))

    # -- streams
    async def _deltas(self, params: SamplingParams, stream):
        """(out, text delta, new token ids, their logprobs) per engine output; the last one is finished."""
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        async for out in stream:
            c = out.outputs[0]
            new = out.new_token_ids
            text = detok.add(new, emit=not out.finished)
            if out.finished:
                text += detok.finish(c.text)
            lps = c.logprobs[len(c.token_ids) - len(new):] if (c.logprobs is not None and new) else []
            yield out, text, new, lps

    async def completion_events(self, req: P.CompletionRequest, params, stream, rid, created, n_prompt):
        model, text_pos = self.model_name, 0
        try:
            async for out, text, new, lps in self._deltas(params, stream):
                c = out.outputs[0]
                lp = None
                if params.logprobs is not None:
                    lp = self.completion_logprobs(new, lps, text_pos)
                text_pos += len(text)
                u = P.usage(n_prompt, len(c.token_ids)) if req.continuous_usage else None
                yield _sse(P.completion_chunk(rid, created, model, text, c.finish_reason if out.finished else None,
                                              lp, u, c.stop_reason if out.finished else None))
                if out.finished and req.include_usage:
                    yield _sse(P.usage_chunk(rid, created, model, "text_completion",
                                             P.usage(n_prompt, len(c.token_ids))))
        except (EngineError, ShuttingDownError, ValueError) as e:
            yield _sse(P.error_body(str(e), "server_error" if isinstance(e, EngineError) else "invalid_request_error"))
        yield _sse("[DONE]")

    async def chat_events(self, req: P.ChatCompletionRequest, params, stream, rid, created, n_prompt):
        model = self.model_name
        try:
            yield _sse(P.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}, None,
                                    usage_=P.usage(n_prompt, 0) if req.continuous_usage else None))
            async for out, text, new, lps in self._deltas(params, stream):
                c = out.outputs[0]
                lp = self.chat_logprobs(new, lps, req.top_logprobs or 0) if req.logprobs else None
                u = P.usage(n_prompt, len(c.token_ids)) if req.continuous_usage else None
                delta = {"content": text} if (text or not out.finished) else {}
                yield _sse(P.chat_chunk(rid, created, model, delta, c.finish_reason if out.finished else None,
                                        lp, u, c.stop_reason if out.finished else None))
                if out.finished and req.include_usage:
                    yield _sse(P.usage_chunk(rid, created, model, "chat.completion.chunk",
                                             P.usage(n_prompt, len(c.token_ids))))
        except (EngineError, ShuttingDownError, ValueError) as e:
            yield _sse(P.error_body(str(e), "server_error" if isinstance(e, EngineError) else "invalid_request_error"))
        yield _sse("[DONE]")


def build_app(async_engine: AsyncEngine, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    server = OpenAIServer(async_engine, settings)

    @asynccontextmanager
    async def lifespan(app):
        async_engine.start()
        try:
            yield
        finally:
            async_engine.shutdown()

    app = FastAPI(title="testbed", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.state.async_engine = async_engine

    async def check_api_key(request: Request) -> None:
        if settings.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), settings.api_key.encode()):
            raise P.APIError("Incorrect or missing API key (send `Authorization: Bearer <key>`).", 401,
                             "invalid_request_error", code="invalid_api_key")

    @app.exception_handler(P.APIError)
    async def _api_error(request, exc: P.APIError):
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        message = {404: f"no route {request.method} {request.url.path}",
                   405: f"method {request.method} not allowed on {request.url.path}"}.get(exc.status_code,
                                                                                        str(exc.detail))
        return JSONResponse(P.error_body(message, "invalid_request_error", code=str(exc.status_code)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        return JSONResponse(P.error_body(str(exc), "invalid_request_error"), status_code=400)

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(P.error_body(f"internal error: {exc!r}", "server_error"), status_code=500)

    auth = [Depends(check_api_key)]

    @app.post("/v1/completions", dependencies=auth)
    async def completions(request: Request):
        return await server.completions(request)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(request: Request):
        return await server.chat(request)

    @app.get("/v1/models", dependencies=auth)
    async def models():
        return server.model_list()

    @app.get("/v1/models/{model_id:path}", dependencies=auth)
    async def model(model_id: str):
        if model_id != server.model_name:
            raise P.APIError(f"The model `{model_id}` does not exist.", 404, param="model", code="model_not_found")
        return server.model_list()["data"][0]

    @app.get("/health")
    async def health():
        if not async_engine.is_alive:
            return JSONResponse(P.error_body("the engine is not running", "server_error"), status_code=503)
        return {"status": "draining" if async_engine.draining else "ok",
                "in_flight": async_engine.num_in_flight}

    @app.get("/metrics")
    async def metrics():
        body, content_type = async_engine.metrics.render()
        return Response(body, media_type=content_type)

    return app


def make_server(engine, settings: ServerSettings) -> tuple[_Server, AsyncEngine]:
    async_engine = AsyncEngine(engine, settings.max_waiting, ServerMetrics(settings.served_model_name
                                                                           or engine.model_name))
    app = build_app(async_engine, settings)
    config = uvicorn.Config(app, host=settings.host, port=int(settings.port), log_level=settings.log_level,
                            access_log=settings.access_log, lifespan="on", timeout_keep_alive=30,
                            timeout_graceful_shutdown=math.ceil(settings.graceful_timeout_s) + 5)
    return _Server(config, async_engine, settings.graceful_timeout_s), async_engine


class _Server(uvicorn.Server):
    """uvicorn.Server that stops admitting on the first signal and exits cleanly afterwards
    (uvicorn would re-raise the signal once shut down, killing the process with it)."""

    def __init__(self, config, async_engine: AsyncEngine, graceful_timeout_s: float = 30.0):
        super().__init__(config)
        self.async_engine = async_engine
        self.graceful_timeout_s = graceful_timeout_s

    def handle_exit(self, sig, frame) -> None:
        if not self.async_engine.draining:
            logger.info("signal %s: draining %d in-flight requests (up to %ss)", sig,
                        self.async_engine.num_in_flight, self.graceful_timeout_s)
            self.async_engine.begin_drain()
            # past the grace period, end what is left properly (finish_reason "abort", then [DONE]);
            # uvicorn's own timeout, a little later, is the backstop that cuts connections
            timer = threading.Timer(self.graceful_timeout_s, self.async_engine.abort_all)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve(engine, server_cfg: Any = None, **overrides) -> dict:
    """Serve `engine` until SIGTERM/SIGINT; returns a small summary. Used by `run.py mode=serve`."""
    settings = ServerSettings.from_cfg(server_cfg, **overrides)
    server, async_engine = make_server(engine, settings)
    logger.info("serving %s on http://%s:%s (api key %s)", settings.served_model_name or engine.model_name,
                settings.host, settings.port, "required" if settings.api_key else "off")
    server.run()
    return {"mode": "serve", "model": settings.served_model_name or engine.model_name,
            "num_finished": async_engine.num_finished, "num_steps": async_engine.num_steps}


class ServerThread:
    """An in-process server on a free loopback port, in a background thread (tests, notebooks).

        with ServerThread(engine, api_key="k") as srv:
            openai.OpenAI(base_url=srv.url + "/v1", api_key="k")...
    """

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 0, **settings):
        settings.setdefault("log_level", "warning")
        self.settings = ServerSettings.from_cfg(None, host=host, port=port, **settings)
        self.server, self.async_engine = make_server(engine, self.settings)
        self.engine = engine
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = self._sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="uvicorn", daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """What SIGTERM does: refuse new requests, let in-flight ones finish for graceful_timeout_s, then
        abort them; returns once the server has shut down."""
        if self._thread.is_alive():
            self.server.handle_exit(signal.SIGTERM, None)
            self._thread.join(timeout if timeout is not None else self.settings.graceful_timeout_s + 30)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def cli(argv: list[str] | None = None) -> None:
    """`testbed-serve [--host H] [--port P] [--api-key K] [--max-waiting N] [hydra overrides...]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = {"--host": "server.host", "--port": "server.port", "--api-key": "server.api_key",
             "--max-waiting": "server.max_waiting"}
    overrides, i = ["mode=serve"], 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in flags:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{name} needs a value")
                value, i = argv[i + 1], i + 1
            overrides.append(f"{flags[name]}={value}")
        elif arg in ("-h", "--help"):
            print(cli.__doc__)
            print("Hydra overrides as for run.py, e.g. model=tiny cache.num_blocks=4096 server.graceful_timeout_s=5")
            return
        else:
            overrides.append(arg)
        i += 1
    sys.argv = [sys.argv[0], *overrides]
    # run run.py as __main__: Hydra then finds conf/ next to the file (imported as a module, it would
    # look for a `conf` package instead and fail outside the repository root)
    import runpy

    import run
    runpy.run_path(run.__file__, run_name="__main__")
