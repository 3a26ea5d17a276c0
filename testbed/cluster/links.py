"""KV transfer links between prefill and decode replicas (bandwidth one way, GB/s = 1e9 bytes/s, from each
link's specification; latency per transfer, assumed where no spec gives one). A composed run passes the
`link` group's values; a bare name reads the built-in sheet in testbed/specs/link/.

A transfer of B bytes takes B / bandwidth + latency (no protocol overhead, no congestion beyond the
decode replica's own link, which carries one transfer at a time: see testbed.cluster.disaggregated)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.specs import builtin_names, builtin_spec


@dataclass(frozen=True)
class LinkSpec:
    name: str
    bandwidth_gbs: float
    latency_us: float
    source: str = ""

    def __post_init__(self):
        for key, low in (("bandwidth_gbs", 0.0), ("latency_us", 0.0)):
            value = getattr(self, key)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < low or (key == "bandwidth_gbs" and value == 0):
                raise ValueError(
                    f"link {self.name!r}: {key} must be a finite number >= 0 (bandwidth > 0), got {value!r}"
                )

    def transfer_time(self, num_bytes: int) -> float:
        """Seconds to move num_bytes: bytes / bandwidth + latency."""
        return num_bytes / (self.bandwidth_gbs * 1e9) + self.latency_us * 1e-6


def known_links() -> list[str]:
    return builtin_names("link")


def load_link(value: str | dict | LinkSpec) -> LinkSpec:
    """A link by built-in name or from a mapping {name, bandwidth_gbs, latency_us[, source]}."""
    if isinstance(value, LinkSpec):
        return value
    if isinstance(value, str):
        conf = builtin_spec("link", value)
        if conf is None:
            raise ValueError(f"unknown link {value!r} (built in: {', '.join(known_links())})")
        value = {"name": value, **conf}
    if not isinstance(value, dict):
        raise ValueError(f"cluster.link must be a link name or a mapping, got {value!r}")
    missing = [k for k in ("bandwidth_gbs", "latency_us") if k not in value]
    if missing:
        raise ValueError(f"link {value.get('name', '?')!r} lacks {missing}")
    unknown = sorted(set(value) - {"name", "bandwidth_gbs", "latency_us", "source"})
    if unknown:
        raise ValueError(f"link {value.get('name', '?')!r}: unknown keys {unknown}")
    return LinkSpec(
        str(value.get("name", "custom")), value["bandwidth_gbs"], value["latency_us"], value.get("source", "")
    )
