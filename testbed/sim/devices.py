"""Device descriptions for the roofline cost model: conf/device/NAME.yaml (spec-sheet bandwidth and
dense bf16 rate, achievable-efficiency factors, per-step and per-sequence overheads)."""

from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEVICE_CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "device"


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_gb: float
    hbm_bandwidth_gbs: float  # bytes/s / 1e9
    bf16_tflops: float  # dense
    efficiency: dict = field(default_factory=lambda: {"flops": 0.7, "bandwidth": 0.8})
    step_overhead_us: float = 0.0
    seq_overhead_us: float = 0.0
    source: str = ""

    @property
    def flops(self) -> float:
        """Achievable FLOP/s."""
        return self.bf16_tflops * 1e12 * self.efficiency["flops"]

    @property
    def bandwidth(self) -> float:
        """Achievable bytes/s."""
        return self.hbm_bandwidth_gbs * 1e9 * self.efficiency["bandwidth"]


def known_devices() -> list[str]:
    return sorted(p.stem for p in DEVICE_CONF_DIR.glob("*.yaml"))


def load_device(name: str) -> DeviceSpec:
    path = DEVICE_CONF_DIR / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"unknown device {name!r}: no {path} (known: {', '.join(known_devices())})")
    conf = yaml.safe_load(path.read_text()) or {}
    missing = [k for k in ("memory_gb", "hbm_bandwidth_gbs", "bf16_tflops") if k not in conf]
    if missing:
        raise ValueError(
            f"device {name!r} has no spec sheet ({path} lacks {missing}): the roofline cost model "
            "cannot price it; simulate it with a measured profile (executor.cost_model=profile)"
        )
    eff = dict(conf.get("efficiency") or {})
    for key in ("flops", "bandwidth"):
        if not 0 < eff.get(key, 0) <= 1:
            raise ValueError(f"{path}: efficiency.{key} must be in (0, 1], got {eff.get(key)}")
    return DeviceSpec(
        conf.get("name", name),
        float(conf["memory_gb"]),
        float(conf["hbm_bandwidth_gbs"]),
        float(conf["bf16_tflops"]),
        eff,
        float(conf.get("step_overhead_us", 0.0)),
        float(conf.get("seq_overhead_us", 0.0)),
        conf.get("source", ""),
    )
