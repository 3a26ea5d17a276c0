"""The executor group: which executor kind runs the steps (testbed.executor_kinds), on which device with
which kernels, and each kind's own settings (the real engine's CUDA graphs, the host executor's step time,
the simulator's SimConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.fields import flat
from testbed.sim.config import SimConfig
from testbed.typecheck import check_field_types


@dataclass
class ExecutorConfig:
    # real (the model) | host (no model: host-side cost) | sim (a cost model, virtual clock) | the import path
    # of an ExecutorKind subclass (module:Class)
    name: str = flat("executor", "real")
    kernel: str = "auto"  # attention/layer kernels: auto | torch | triton | cpu (auto: fastest that works here)
    device: str | None = None  # None: cuda if available
    enforce_eager: bool = False  # True: no CUDA graphs (decode graphs need CUDA and kernel=triton)
    cuda_graph_sizes: list[int] | None = None  # decode batch sizes to capture; None: 1,2,4,8,16,...,max_num_seqs
    cuda_graph_dry_run: bool = False  # the graph path (static buffers, padding) run eagerly, any device: tests
    step_time_s: float = flat("host_step_time_s", 0.0)  # host: hold the "device" this long per step
    sim: SimConfig | None = flat("sim_config", None)  # sim: the cost model, the device's spec sheet, ... (or a mapping)

    def __post_init__(self):
        if isinstance(self.sim, dict):
            self.sim = SimConfig.from_any(self.sim)
        check_field_types(self)
        if self.cuda_graph_sizes is not None and (not self.cuda_graph_sizes or min(self.cuda_graph_sizes) < 1):
            raise ValueError(f"cuda_graph_sizes must be positive batch sizes, got {self.cuda_graph_sizes}")
