"""The engine behind an asyncio server: one stepping thread, fed through a thread-safe command queue.

The engine is not thread-safe, so only the stepping thread touches it (adds, aborts, steps). The
event loop hands it commands (`_Add`, `_Abort`, `_Stop`) through a `queue.SimpleQueue` and gets
RequestOutputs back through one asyncio.Queue per request (`RequestStream`), delivered with one
`call_soon_threadsafe` per step. The thread blocks on the command queue while the engine is idle.

Admission control: at most `max_waiting` requests may wait (in the engine's waiting queue or still on
their way to it); beyond that `add_request` raises QueueFullError (the server answers 503).
A consumer that goes away aborts its request (`RequestStream.abort()`), which frees its KV blocks on
the stepping thread's next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from dataclasses import dataclass

from testbed.outputs import RequestOutput
from testbed.sampling_params import SamplingParams
from testbed.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)


class QueueFullError(Exception):
    """Too many requests are waiting: try later (HTTP 503)."""


class ShuttingDownError(Exception):
    """The server is draining or stopped and takes no new requests (HTTP 503)."""


class EngineError(RuntimeError):
    """This request failed in the engine (its own failure, finish_reason "error", or the engine's):
    HTTP 500 with an OpenAI-style body, or an error event mid-stream."""


@dataclass
class _Add:
    stream: RequestStream
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float | None
    priority: int


@dataclass
class _Abort:
    request_id: str


@dataclass
class _AbortAll:
    pass


@dataclass
class _Stop:
    pass


def _queued(cmds: queue.SimpleQueue):
    """The commands already in the queue, taken one at a time without blocking."""
    while True:
        try:
            yield cmds.get_nowait()
        except queue.Empty:
            return


class RequestStream:
    """Outputs of one request, in order; iteration ends after the finished output (or raises)."""

    def __init__(self, request_id: str, owner: AsyncEngine):
        self.request_id = request_id
        self._owner = owner
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False  # set on the event loop when the finished output is delivered
        self.aborted = False

    def _put(self, item) -> None:  # event-loop thread
        if isinstance(item, RequestOutput) and item.finished or isinstance(item, BaseException):
            self.finished = True
        self._queue.put_nowait(item)

    async def get(self) -> RequestOutput:
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self):
        return self._iter()

    async def _iter(self):
        while True:
            out = await self.get()
            yield out
            if out.finished:
                return

    def abort(self) -> None:
        """Abort unless already finished (idempotent, safe from any coroutine on the loop)."""
        if not self.finished and not self.aborted:
            self.aborted = True
            self._owner.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine, max_waiting: int = 1024, metrics: ServerMetrics | None = None):
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = metrics or ServerMetrics(engine.model_name)
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending_adds = 0  # handed over, not yet in the engine (guarded by _lock)
        self._num_waiting = 0  # the engine's waiting queue after the last step (stepping thread writes)
        self._live: dict[str, RequestStream] = {}  # stepping thread only
        self._first_token_seen: set[str] = set()  # stepping thread only
        self._params: dict[str, SamplingParams] = {}  # stepping thread only: for the metrics at finish
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.draining = False
        self.stopped = False
        self.last_error: BaseException | None = None
        self.num_steps = 0
        self.num_finished = 0

    # ---- lifecycle (event loop) ---------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._thread is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self.metrics.engine_state(self.engine, 0)
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def begin_drain(self) -> None:
        """Refuse new requests from now on; the ones in flight carry on."""
        self.draining = True

    def abort_all(self) -> None:
        """Abort every request in flight (thread-safe): each stream ends with finish_reason "abort"."""
        self._cmds.put(_AbortAll())

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort whatever is still in flight and stop the stepping thread (blocks up to timeout)."""
        self.draining = True
        if self._thread is None or self.stopped:
            return
        self._cmds.put(_Stop())
        self._thread.join(timeout)
        self.stopped = True
        if self._thread.is_alive():
            logger.error("the stepping thread did not stop within %.1f s", timeout)

    async def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until nothing is in flight (for tests and drains)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.num_in_flight and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return not self.num_in_flight

    @property
    def num_in_flight(self) -> int:
        return len(self._live) + self._pending_adds

    # ---- requests (event loop) ----------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        # reads only fixed sizes (context, vocabulary, block count), so it is safe off the stepping thread
        self.engine.validate(prompt_token_ids, params)

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> RequestStream:
        """Validate (ValueError), admit (QueueFullError / ShuttingDownError) and hand over a request."""
        if self.draining or not self.is_alive:
            self.metrics.rejected("shutting_down")
            raise ShuttingDownError("the server is shutting down" if self.draining else "the engine is not running")
        request_id = request_id or uuid.uuid4().hex
        self.validate(prompt_token_ids, params)
        with self._lock:
            waiting = self._num_waiting + self._pending_adds
            if waiting >= self.max_waiting:
                self.metrics.rejected("queue_full")
                raise QueueFullError(f"{waiting} requests are waiting (max_waiting={self.max_waiting}); retry later")
            self._pending_adds += 1
        stream = RequestStream(request_id, self)
        self._cmds.put(
            _Add(
                stream,
                list(prompt_token_ids),
                params,
                self.engine.clock() if arrival_time is None else arrival_time,
                priority,
            )
        )
        return stream

    def abort(self, request_id: str) -> None:
        self._cmds.put(_Abort(request_id))

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ):
        """Async iterator of RequestOutputs; leaving it early aborts the request."""
        stream = self.add_request(prompt_token_ids, params, request_id, arrival_time)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    # ---- the stepping thread ------------------------------------------------------------------------
    def _deliver(self, batch: list[tuple[RequestStream, object]]) -> None:
        if not batch:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def put_all():
            for stream, item in batch:
                stream._put(item)

        with contextlib.suppress(RuntimeError):  # the loop closed under us at shutdown
            loop.call_soon_threadsafe(put_all)

    def _handle(self, cmd, batch: list) -> bool:
        """Apply one command; False for _Stop."""
        engine = self.engine
        if isinstance(cmd, _Add):
            rid = cmd.stream.request_id
            try:
                engine.add_request(rid, cmd.prompt_token_ids, cmd.params, cmd.arrival_time, cmd.priority)
            except Exception as e:  # validated already; duplicates and the like land here
                batch.append((cmd.stream, ValueError(str(e)) if isinstance(e, ValueError) else EngineError(str(e))))
            else:
                self._live[rid] = cmd.stream
                self._params[rid] = cmd.params
            finally:
                with self._lock:
                    self._pending_adds -= 1
                    self._num_waiting = engine.scheduler.num_waiting
        elif isinstance(cmd, _Abort):
            stream = self._live.pop(cmd.request_id, None)
            out = engine.abort(cmd.request_id)
            if out is not None:
                self._on_output(out, stream, batch)
        elif isinstance(cmd, _AbortAll):
            self._abort_all(None, batch)
        elif isinstance(cmd, _Stop):
            return False
        return True

    def _on_output(self, out: RequestOutput, stream: RequestStream | None, batch: list) -> None:
        rid = out.request_id
        first = (
            rid not in self._first_token_seen and out.metrics is not None and out.metrics.first_token_time is not None
        )
        if first:
            self._first_token_seen.add(rid)
        params = self._params.pop(rid, None) if out.finished else None
        self.metrics.on_output(out, first, params=params)
        item: RequestOutput | EngineError = out  # what the stream gets
        if out.finished:
            self._first_token_seen.discard(rid)
            self._live.pop(rid, None)
            self.num_finished += 1
            if out.outputs[0].finish_reason == "error":  # this request failed, the others go on
                item = EngineError(f"request {rid} failed: {out.error}")
        if stream is not None:
            batch.append((stream, item))

    def _publish_state(self) -> None:
        with self._lock:
            self._num_waiting = self.engine.scheduler.num_waiting
            pending = self._pending_adds
        self.metrics.engine_state(self.engine, pending)

    def _abort_all(self, error: BaseException | None, batch: list) -> None:
        for rid, stream in list(self._live.items()):
            try:
                out = self.engine.abort(rid)
            except Exception:  # a broken engine must not keep streams hanging
                logger.exception("abort of %s failed", rid)
                out = None
            if error is not None:
                self._live.pop(rid, None)
                self._params.pop(rid, None)
                self._first_token_seen.discard(rid)
                if out is not None:
                    self.metrics.on_output(out, False, "error")
                batch.append((stream, EngineError(f"engine failure: {error!r}")))
            elif out is not None:
                self._on_output(out, stream, batch)
            else:
                self._live.pop(rid, None)
                self._params.pop(rid, None)
                batch.append((stream, EngineError("request lost at shutdown")))

    def _run(self) -> None:
        engine, cmds = self.engine, self._cmds
        running = True
        while running:
            batch: list = []
            try:
                # block while idle; otherwise take whatever arrived during the last step
                if not engine.has_unfinished():
                    running = self._handle(cmds.get(), batch)
                if running:
                    for cmd in _queued(cmds):
                        running = self._handle(cmd, batch)
                        if not running:
                            break
                if running and engine.has_unfinished():
                    for out in engine.step():
                        self._on_output(out, self._live.get(out.request_id), batch)
                    self.num_steps += 1
            except Exception as e:  # keep serving: fail what was in flight, report it
                logger.exception("engine step failed; aborting %d in-flight requests", len(self._live))
                self.last_error = e
                self._abort_all(e, batch)
            self._publish_state()
            self._deliver(batch)
        # _Stop: abort what is left, give every stream its end, then drain stray commands
        batch = []
        self._abort_all(None, batch)
        for cmd in _queued(cmds):
            if isinstance(cmd, _Add):
                with self._lock:
                    self._pending_adds -= 1
                batch.append((cmd.stream, ShuttingDownError("the server is shutting down")))
        self._publish_state()
        self._deliver(batch)
