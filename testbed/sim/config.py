"""Settings of the simulated executor (`EngineConfig(executor="sim", sim_config={...})`)."""

import math
from dataclasses import dataclass, fields

from testbed.sim.cost_models import COST_MODELS, REPLAY_STEPS, cost_model_class
from testbed.sim.devices import DeviceSpec, has_sheet, load_device


@dataclass
class SimConfig:
    cost_model: str = "roofline"  # roofline | profile | operators | replay_steps | module:Class (a CostModel)
    cost_model_options: dict | None = None  # a user's cost model (module:Class): its constructor's arguments
    device: str | dict | DeviceSpec | None = None  # roofline: a spec sheet (its values, or a built-in name)
    profile: str | None = (
        None  # profile, operators: a profile JSON (experiments.calibration.calibrate writes results/profiles/)
    )
    run: str | None = None  # replay_steps: the folder of a recorded real run (clock.parquet, steps.parquet)
    spec_acceptance: float = 0.7  # speculative decoding: each draft accepted with this probability
    allow_extrapolation: bool = False  # profile: price batches beyond the calibrated range instead of refusing
    seed: int = 0  # draws of the acceptance model
    tp_link: str | dict = "nvlink"  # parallel.tensor_parallel_size > 1: the link all-reduces are priced over
    skip_steps: bool = True  # advance runs of pure decode steps in one go (testbed.sim.decode_runs; same results)
    cost_scale: float = 1.0  # every step's price x this (a device X% slower: 1 + X/100; testbed.sim.cost_models.scaled)

    def __post_init__(self):
        if self.cost_model == REPLAY_STEPS:
            if self.cost_model_options:
                raise ValueError(f"sim cost_model replay_steps takes no options {sorted(self.cost_model_options)}")
        elif cost_model_class(self.cost_model, self.cost_model_options or {}).kv_capacity == "device":
            if not self.device:
                raise ValueError(
                    f"the {self.cost_model} cost model needs a device with a spec sheet (device=h100-sxm, ...)"
                )
            self.device = load_device(self.device)
        elif self.cost_model not in COST_MODELS and self.device is not None and has_sheet(self.device):
            self.device = load_device(self.device)  # a user's model gets the sheet when one is composed
        if self.cost_model in ("profile", "operators") and not self.profile:
            raise ValueError(f"the {self.cost_model} cost model needs a profile file (executor.profile=PATH)")
        if self.cost_model == "replay_steps" and not self.run:
            raise ValueError("the replay_steps cost model needs a recorded run folder (executor.run=DIR)")
        if not (math.isfinite(self.cost_scale) and self.cost_scale > 0):
            raise ValueError(f"executor.cost_scale must be a finite number > 0, got {self.cost_scale}")
        if self.cost_model == REPLAY_STEPS and self.cost_scale != 1:
            raise ValueError("executor.cost_scale scales a cost model's prices: replay_steps replays recorded time")
        if not 0 <= self.spec_acceptance <= 1:
            raise ValueError(f"spec_acceptance must be in [0, 1], got {self.spec_acceptance}")

    @classmethod
    def from_any(cls, value) -> "SimConfig":
        if value is None:
            return cls.__new__(cls)  # unvalidated defaults: only read when executor == "sim"
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"sim_config must be a dict, got {type(value).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown sim_config keys {unknown}; known: {sorted(names)}")
        return cls(**{k: v for k, v in value.items() if v is not None})
