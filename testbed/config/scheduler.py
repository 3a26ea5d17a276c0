"""The scheduler group: the policy, its options and the per-step limits (vLLM's SchedulerConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.fields import flat
from testbed.typecheck import check_field_types


@dataclass
class SchedulerConfig:
    name: str = flat("scheduler", "fcfs")  # policy name (testbed.core.policies) or module:Class
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    options: dict = flat("scheduler_options", default_factory=dict)  # the policy's own: checked by its signature
    async_scheduling: bool | None = None  # schedule step N+1 while step N runs; None: the executor kind's default

    def __post_init__(self):
        check_field_types(self)
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
