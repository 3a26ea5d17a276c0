"""The engine's configuration: one object per group, nested in EngineConfig (testbed.config.engine)."""

from testbed.config.cache import CacheConfig
from testbed.config.engine import FLAT_KEYWORDS, EngineConfig
from testbed.config.executor import ExecutorConfig
from testbed.config.model import ModelConfig
from testbed.config.parallel import ParallelConfig
from testbed.config.scheduler import SchedulerConfig
from testbed.core.host_tier import HostTierConfig
from testbed.sim.config import SimConfig
from testbed.spec.config import SpeculativeConfig
from testbed.structured.limits import StructuredOutputsConfig

__all__ = [
    "FLAT_KEYWORDS",
    "CacheConfig",
    "EngineConfig",
    "ExecutorConfig",
    "HostTierConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "SimConfig",
    "SpeculativeConfig",
    "StructuredOutputsConfig",
]
