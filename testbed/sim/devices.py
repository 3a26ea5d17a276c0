"""Device descriptions for the roofline cost model (spec-sheet bandwidth and dense bf16 rate,
achievable-efficiency factors, per-step and per-sequence overheads).

A DeviceSpec is built from values: a composed run passes the `device` group's mapping (overrides
applied); a bare name reads the built-in sheet in testbed/specs/device/."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from testbed.specs import builtin_names, builtin_spec

SHEET_KEYS = ("memory_gb", "hbm_bandwidth_gbs", "bf16_tflops")


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
    torch_device: str | None = None  # what the real engine runs on (cuda | cpu | None: auto)

    def __post_init__(self):
        for key in (*SHEET_KEYS, "step_overhead_us", "seq_overhead_us"):
            value = getattr(self, key)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (key in SHEET_KEYS and value == 0):
                raise ValueError(f"device {self.name!r}: {key} must be a finite number > 0, got {value!r}")
        if not isinstance(self.efficiency, dict) or sorted(self.efficiency) != ["bandwidth", "flops"]:
            raise ValueError(f"device {self.name!r}: efficiency must be {{flops, bandwidth}}, got {self.efficiency!r}")
        for key, value in self.efficiency.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"device {self.name!r}: efficiency.{key} must be in (0, 1], got {value!r}")

    @property
    def flops(self) -> float:
        """Achievable FLOP/s."""
        return self.bf16_tflops * 1e12 * self.efficiency["flops"]

    @property
    def bandwidth(self) -> float:
        """Achievable bytes/s."""
        return self.hbm_bandwidth_gbs * 1e9 * self.efficiency["bandwidth"]


def known_devices() -> list[str]:
    return builtin_names("device")


def has_sheet(value) -> bool:
    """Whether `value` names or holds a device spec sheet (the `auto` device group holds none)."""
    if isinstance(value, (DeviceSpec, str)):
        return True
    return isinstance(value, dict) and all(value.get(k) is not None for k in SHEET_KEYS)


def load_device(value: str | dict | DeviceSpec) -> DeviceSpec:
    """A device with a spec sheet: a DeviceSpec, a mapping of its fields (the composed `device` group), or
    the name of a built-in sheet."""
    if isinstance(value, DeviceSpec):
        return value
    if isinstance(value, str):
        conf = builtin_spec("device", value)
        if conf is None:
            raise ValueError(f"unknown device {value!r} (built in: {', '.join(known_devices())})")
        value = {"name": value, **conf}
    if not isinstance(value, dict):
        raise ValueError(f"a device is a name or a mapping of its spec sheet, got {value!r}")
    name = value.get("name", "custom")
    missing = [k for k in SHEET_KEYS if value.get(k) is None]
    if missing:
        raise ValueError(
            f"device {name!r} has no spec sheet (lacks {missing}): the roofline cost model "
            "cannot price it; simulate it with a measured profile (executor.cost_model=profile)"
        )
    known = {f.name for f in fields(DeviceSpec)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"device {name!r}: unknown keys {unknown}; known: {sorted(known)}")
    values = {k: v for k, v in value.items() if v is not None}
    values["efficiency"] = dict(values.get("efficiency") or {"flops": 0.7, "bandwidth": 0.8})
    return DeviceSpec(**{"name": name, **values})
