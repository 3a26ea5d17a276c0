"""The router's own Prometheus series (its /metrics), in its own registry.

Series are labelled by the backend's position in cluster.backends ("0", "1", ...), so the page a scraper
(or anyone who can reach it) reads names no backend host; `cluster.metrics_backend_urls=true` labels them
by URL instead. /health?detail=true (behind the api key) maps positions to URLs."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

DURATION_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]


class RouterMetrics:
    def __init__(self, label_by_url: bool = False):
        self.label_by_url = label_by_url
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "testbed_router_requests", "Requests answered, by backend and outcome.", ["backend", "outcome"], registry=r
        )
        self.retries = Counter(
            "testbed_router_retries", "Requests re-sent elsewhere: the backend could not be reached.", ["backend"],
            registry=r,
        )  # fmt: skip
        self.no_backend = Counter("testbed_router_no_backend", "Requests refused: no healthy backend.", registry=r)
        self.probe_failures = Counter(
            "testbed_router_probe_failures", "Failed /health probes.", ["backend"], registry=r
        )
        self.healthy = Gauge(
            "testbed_router_backend_healthy", "1 if the backend gets requests.", ["backend"], registry=r
        )
        self.outstanding = Gauge(
            "testbed_router_backend_outstanding", "Requests in flight at the backend.", ["backend"], registry=r
        )
        self.duration = Histogram(
            "testbed_router_request_duration_seconds",
            "From receipt to the last byte relayed.",
            ["backend"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )

    def label(self, backend) -> str:
        """The `backend` label of a backend's series."""
        return backend.url if self.label_by_url else str(backend.index)

    def render(self, backends) -> tuple[bytes, str]:
        for b in backends:
            self.healthy.labels(self.label(b)).set(1 if b.healthy else 0)
            self.outstanding.labels(self.label(b)).set(b.outstanding)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
