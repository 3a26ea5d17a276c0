"""The `cluster:` config group as one validated dataclass (conf/cluster/default.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from testbed.cluster.links import LinkSpec, load_link
from testbed.cluster.routers import router_class


@dataclass
class ClusterConfig:
    replicas: int = 1  # engine replicas behind the router (1 and no P/D: a single engine, as without a cluster)
    router: str = "round_robin"  # testbed.cluster.routers; with P/D, the prefill replicas' router
    router_options: dict = field(default_factory=dict)  # e.g. prefix_affinity: {load_factor: 1.25}
    decode_router: str = "least_outstanding"  # P/D: which decode replica takes a prefilled request
    prefill_replicas: int = 0  # P/D disaggregation: P prefill and D decode replicas (both > 0)
    decode_replicas: int = 0
    link: str | dict | LinkSpec = "ib-400g"  # P/D KV transfer link: its values, or a built-in name
    backends: list[str] = field(default_factory=list)  # mode=route: URLs of testbed-serve backends
    probe_interval_s: float = 1.0  # mode=route: /health probe period per backend
    probe_timeout_s: float = 2.0
    unhealthy_after: int = 2  # consecutive failed probes (or connection failures) before a backend is skipped
    request_timeout_s: int | float = 600.0  # mode=route: a backend reply (or stream chunk) slower than this fails
    stall_timeout_s: float = 60.0  # mode=route: a stream silent this long fails (request_timeout_s: the whole)
    failure_window_s: float = 30.0  # mode=route: unhealthy_after bad answers within this mark a backend unhealthy
    metrics_backend_urls: bool = False  # mode=route: /metrics labels backends by URL (default: by position)
    threads_per_replica: int | None = None  # real replicas (processes): torch threads each; None: cores / N

    def __post_init__(self):
        for name in ("replicas", "prefill_replicas", "decode_replicas", "unhealthy_after"):
            value = getattr(self, name)
            low = 1 if name in ("replicas", "unhealthy_after") else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"cluster.{name} must be an integer >= {low}, got {value!r}")
        if (self.prefill_replicas > 0) != (self.decode_replicas > 0):
            raise ValueError(
                "cluster.prefill_replicas and cluster.decode_replicas go together (P/D disaggregation needs "
                f"both > 0), got {self.prefill_replicas} and {self.decode_replicas}"
            )
        if self.disaggregated and self.replicas not in (1, self.prefill_replicas + self.decode_replicas):
            raise ValueError(
                f"cluster.replicas={self.replicas} disagrees with prefill_replicas + decode_replicas = "
                f"{self.prefill_replicas + self.decode_replicas} (leave replicas at 1 with P/D)"
            )
        for name in ("router", "decode_router"):
            try:
                router_class(getattr(self, name))
            except ValueError as e:
                raise ValueError(f"cluster.{name}: {e}") from e
        self.link = load_link(self.link)
        if not isinstance(self.router_options, dict):
            raise ValueError(f"cluster.router_options must be a mapping, got {self.router_options!r}")
        for name in ("probe_interval_s", "probe_timeout_s", "request_timeout_s", "failure_window_s", "stall_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"cluster.{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.metrics_backend_urls, bool):
            raise ValueError(f"cluster.metrics_backend_urls must be true or false, got {self.metrics_backend_urls!r}")
        if self.threads_per_replica is not None and (
            not isinstance(self.threads_per_replica, int) or self.threads_per_replica < 1
        ):
            raise ValueError(
                f"cluster.threads_per_replica must be null or an integer >= 1, got {self.threads_per_replica!r}"
            )
        if not isinstance(self.backends, (list, tuple)) or not all(isinstance(b, str) for b in self.backends):
            raise ValueError(f"cluster.backends must be a list of URLs, got {self.backends!r}")

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    @property
    def num_replicas(self) -> int:
        return self.prefill_replicas + self.decode_replicas if self.disaggregated else self.replicas

    @property
    def enabled(self) -> bool:
        """False: a plain single-engine run (the cluster code is not involved at all)."""
        return self.num_replicas > 1 or self.disaggregated

    @classmethod
    def from_any(cls, value) -> ClusterConfig:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(value, DictConfig):
                value = OmegaConf.to_container(value, resolve=True)
        except ImportError:  # pragma: no cover
            pass
        if not isinstance(value, dict):
            raise TypeError(f"cluster config must be a mapping, got {type(value).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown cluster keys {unknown}; known: {sorted(names)}")
        values = {k: v for k, v in value.items() if v is not None or k == "threads_per_replica"}
        return cls(**values)
