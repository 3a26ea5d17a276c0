"""The router's backends: what it knows of each testbed-serve (or vLLM) server, and the health probes.

A backend is marked unhealthy after `unhealthy_after` consecutive failures (a /health probe that fails or
times out, or a request that cannot connect), and gets no requests while unhealthy; one successful probe
brings it back. A backend that answers badly (garbage, an HTML error page, a truncated stream: see
relay_checks.py) while its /health is fine is marked unhealthy after `unhealthy_after` such answers within
`failure_window_s`, and stays so until that window has passed since the last one (its probes alone would
bring it straight back). After each good probe its load (running and waiting requests, KV usage) is read from its
/metrics (vLLM's series names), so load-aware routers work over HTTP; its prefix cache cannot be read, so
`is_cached` answers from the prompts routed there (testbed.cluster.prefix.RoutedPrefixes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from testbed.cluster.prefix import RoutedPrefixes

logger = logging.getLogger("testbed.router")

LOAD_SCALE = 1000  # KV usage (a fraction) is shown to routers as free of LOAD_SCALE blocks


@dataclass
class Backend:
    index: int
    url: str
    healthy: bool = True
    failures: int = 0  # consecutive
    outstanding: int = 0  # requests sent and not yet answered in full
    running: int = 0
    waiting: int = 0
    free_blocks: int = LOAD_SCALE
    total_blocks: int = LOAD_SCALE
    prefixes: RoutedPrefixes = field(default_factory=lambda: RoutedPrefixes(1 << 16))
    last_error: str = ""
    bad_answers: deque = field(default_factory=deque)  # monotonic times of bad answers in the window
    held_until: float = 0.0  # bad answers: no probe brings it back before this (monotonic)

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self.prefixes


class BackendPool:
    def __init__(
        self,
        urls: list[str],
        unhealthy_after: int,
        probe_timeout_s: float,
        metrics=None,
        failure_window_s: float = 30.0,
    ):
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"cluster.backends: {url!r} is not an http(s) URL")
        if len(set(urls)) != len(urls):
            raise ValueError(f"cluster.backends lists a URL twice: {urls}")
        self.backends = [Backend(i, url.rstrip("/")) for i, url in enumerate(urls)]
        self.unhealthy_after = unhealthy_after
        self.probe_timeout_s = probe_timeout_s
        self.metrics = metrics
        self.failure_window_s = failure_window_s

    def failure(self, backend: Backend, reason: str) -> None:
        backend.failures += 1
        backend.last_error = reason
        if backend.healthy and backend.failures >= self.unhealthy_after:
            backend.healthy = False
            logger.warning("backend %s marked unhealthy after %d failures: %s", backend.url, backend.failures, reason)

    def bad_answer(self, backend: Backend, reason: str) -> None:
        """An answer that was not OpenAI's shape: `unhealthy_after` of them within the window mark it."""
        now = time.monotonic()
        backend.last_error = reason
        backend.bad_answers.append(now)
        while backend.bad_answers and backend.bad_answers[0] < now - self.failure_window_s:
            backend.bad_answers.popleft()
        if len(backend.bad_answers) >= self.unhealthy_after:
            backend.held_until = now + self.failure_window_s
            if backend.healthy:
                backend.healthy = False
                logger.warning(
                    "backend %s marked unhealthy after %d bad answers: %s",
                    backend.url,
                    len(backend.bad_answers),
                    reason,
                )

    def success(self, backend: Backend) -> None:
        backend.failures = 0
        if not backend.healthy and time.monotonic() >= backend.held_until:
            backend.healthy = True
            logger.warning("backend %s healthy again", backend.url)

    async def probe(self, client: httpx.AsyncClient, backend: Backend) -> None:
        try:
            response = await client.get(f"{backend.url}/health", timeout=self.probe_timeout_s)
        except httpx.HTTPError as e:
            self._probe_failed(backend, f"/health: {type(e).__name__}: {e}")
            return
        if response.status_code != 200:
            self._probe_failed(backend, f"/health answered {response.status_code}")
            return
        self.success(backend)
        try:
            metrics = await client.get(f"{backend.url}/metrics", timeout=self.probe_timeout_s)
            read_load(backend, metrics.text)
        except (httpx.HTTPError, ValueError):
            pass  # load stays as last read; health is what /health says

    def _probe_failed(self, backend: Backend, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.probe_failures.labels(self.metrics.label(backend)).inc()
        self.failure(backend, reason)

    async def probe_all(self, client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(self.probe(client, b) for b in self.backends))

    async def probe_forever(self, client: httpx.AsyncClient, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.probe_all(client)


def read_load(backend: Backend, metrics_text: str) -> None:
    """running / waiting requests and KV usage from a vLLM-style /metrics page (summed over engines)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            values[family.name] = sum(s.value for s in family.samples)
    backend.running = int(values.get("vllm:num_requests_running", backend.running))
    backend.waiting = int(values.get("vllm:num_requests_waiting", backend.waiting))
    if "vllm:kv_cache_usage_perc" in values:
        usage = min(max(values["vllm:kv_cache_usage_perc"], 0.0), 1.0)
        backend.free_blocks = round((1 - usage) * LOAD_SCALE)
