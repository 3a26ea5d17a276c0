"""Prometheus metrics for the server (vLLM's names, `testbed:` prefix), one registry per server.

Gauges are set by the stepping thread after every step and after every batch of adds/aborts; counters
and histograms are fed from the request outputs as the stepping thread sees them (prometheus_client
is thread-safe). Latencies are on the engine clock, from the moment the HTTP request was received.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from testbed.outputs import RequestOutput

disable_created_metrics()  # no *_created series (as vLLM); process-wide in prometheus_client

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
TPOT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
E2E_BUCKETS = [
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]


class ServerMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r, labels, m = self.registry, ["model_name"], model_name

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(m)

        self.num_running = gauge("testbed:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge(
            "testbed:num_requests_waiting",
            "Requests waiting to be scheduled (including ones not yet handed to the engine).",
        )
        self.kv_usage = gauge("testbed:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).")
        self.kv_free_blocks = gauge("testbed:kv_cache_free_blocks", "Free KV-cache blocks (cached-free included).")
        self.kv_num_blocks = gauge("testbed:kv_cache_num_blocks", "KV-cache blocks in total.")
        self.prefix_hit_rate = gauge(
            "testbed:prefix_cache_hit_rate", "Prefix-cache hits / queries, in tokens, since start."
        )
        self.prompt_tokens = Counter(
            "testbed:prompt_tokens", "Prompt tokens of requests that reached their first token.", labels, registry=r
        ).labels(m)
        self.generation_tokens = Counter("testbed:generation_tokens", "Generated tokens.", labels, registry=r).labels(m)
        self._finished = Counter(
            "testbed:request_success", "Finished requests by finish reason.", labels + ["finished_reason"], registry=r
        )
        for reason in ("stop", "length", "abort"):
            self._finished.labels(m, reason)
        self._rejected = Counter(
            "testbed:request_rejected", "Requests refused before the engine saw them.", labels + ["reason"], registry=r
        )
        for reason in ("queue_full", "shutting_down"):
            self._rejected.labels(m, reason)
        self.ttft = Histogram(
            "testbed:time_to_first_token_seconds", "Time to first token.", labels, buckets=TTFT_BUCKETS, registry=r
        ).labels(m)
        self.tpot = Histogram(
            "testbed:time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=r,
        ).labels(m)
        self.e2e = Histogram(
            "testbed:e2e_request_latency_seconds",
            "End-to-end request latency.",
            labels,
            buckets=E2E_BUCKETS,
            registry=r,
        ).labels(m)
        self.model_name = model_name

    # ---- fed by the stepping thread -----------------------------------------------------------------
    def engine_state(self, engine, num_pending: int) -> None:
        kv = engine.kv
        free, total = kv.pool.num_free_blocks, kv.num_blocks
        self.num_running.set(engine.scheduler.num_running)
        self.num_waiting.set(engine.scheduler.num_waiting + num_pending)
        self.kv_free_blocks.set(free)
        self.kv_num_blocks.set(total)
        self.kv_usage.set((total - free) / total if total else 0.0)
        self.prefix_hit_rate.set(kv.prefix_hit_rate)

    def on_output(self, out: RequestOutput, first_token: bool) -> None:
        if out.new_token_ids:
            self.generation_tokens.inc(len(out.new_token_ids))
        m = out.metrics
        if first_token and m is not None and m.first_token_time is not None:
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
        if out.finished:
            reason = out.outputs[0].finish_reason or "abort"
            self._finished.labels(self.model_name, reason).inc()
            if reason != "abort" and m is not None and m.finish_time is not None:
                self.e2e.observe(max(0.0, m.finish_time - m.arrival_time))
                n = len(out.outputs[0].token_ids)
                if n > 1 and m.first_token_time is not None:
                    self.tpot.observe(max(0.0, (m.finish_time - m.first_token_time) / (n - 1)))

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def parse_metrics(text: str) -> dict[str, float]:
    """Flatten an exposition text into {'name{labels}': value} and {'name': value summed over labels}."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        values[key] = v
        name = key.split("{", 1)[0]
        if name != key:
            values[name] = values.get(name, 0.0) + v
    return values
