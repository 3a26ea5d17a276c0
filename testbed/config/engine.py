"""EngineConfig: the engine's settings as one object per group (vLLM's VllmConfig), each group checking its
own fields, the checks across groups here.

Two ways to make one, which give equal configs:

    EngineConfig(model=ModelConfig("tiny"), cache=CacheConfig(block_size=32), scheduler=SchedulerConfig(...))
    EngineConfig(model="tiny", block_size=32, max_num_seqs=8)     # flat keywords (vLLM's EngineArgs names)

A flat keyword is a group field's name, or the flat name the field declares (testbed.config.fields.flat:
`kv_cache_memory_gb` is cache.memory_gb, `cache="static_max"` is cache.name); `speculative_config` and
`structured_outputs_config` give those groups whole (a mapping or the object). Both forms mix; a group
given whole and by flat keywords at once is refused, as is an unknown keyword, naming it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from testbed.config.cache import CacheConfig
from testbed.config.executor import ExecutorConfig
from testbed.config.fields import FLAT, flat, flat_name, renamed
from testbed.config.model import ModelConfig
from testbed.config.parallel import ParallelConfig
from testbed.config.scheduler import SchedulerConfig
from testbed.spec.config import SpeculativeConfig
from testbed.structured.limits import StructuredOutputsConfig
from testbed.typecheck import check_field_types


@dataclass(init=False)
class EngineConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    executor: ExecutorConfig = dataclasses.field(default_factory=ExecutorConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    # vLLM's speculative_config: {"method": "ngram"|"draft"|"layerskip"|module:Class, ...}
    speculative: SpeculativeConfig = flat("speculative_config", default_factory=SpeculativeConfig)
    # grammar compile limits and cache
    structured_outputs: StructuredOutputsConfig = flat(
        "structured_outputs_config", default_factory=StructuredOutputsConfig
    )
    seed: int = 0

    def __init__(self, **kwargs: Any):
        """Groups by their names (as objects) and group fields by their flat keywords (module docstring)."""
        groups, given = {}, {}
        for key, value in kwargs.items():
            group = _GROUPS.get(key)
            if group is not None and isinstance(value, group):
                groups[key] = value
            else:
                given[key] = value
        unknown = sorted(set(given) - set(FLAT_KEYWORDS))
        if unknown:
            raise TypeError(f"unknown engine options {unknown}; known: {sorted(FLAT_KEYWORDS)}")
        for f in dataclasses.fields(self):
            keywords = {k: v for k, v in given.items() if FLAT_KEYWORDS[k][0] == f.name}
            if f.name in groups and keywords:
                raise TypeError(f"{f.name} is given as a {type(groups[f.name]).__name__} and by {sorted(keywords)}")
            setattr(self, f.name, groups[f.name] if f.name in groups else _build(f, keywords))
        self.__post_init__()

    def __post_init__(self):
        """The checks across groups (each group checked its own fields when it was made)."""
        check_field_types(self)
        if self.cache.dtype != "auto" and self.executor.kernel == "triton":
            raise ValueError("kv_cache_dtype other than auto runs with kernel=torch or kernel=cpu, not triton")
        from testbed.executor_kinds import executor_kind

        executor_kind(self.executor.name).check_config(self)  # what this kind cannot run

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineConfig:
        """The flat keyword form (LLM(...)): EngineConfig(**kwargs)."""
        return cls(**kwargs)


def _build(f: dataclasses.Field, keywords: dict) -> Any:
    """Engine field f's value from the flat keywords that go to it (a group's defaults where none do)."""
    if f.name == "seed":
        return keywords.get("seed", f.default)
    group = _GROUPS[f.name]
    if FLAT in f.metadata:  # a group given whole: speculative_config, structured_outputs_config
        value = keywords.get(f.metadata[FLAT])
        return value if isinstance(value, group) else group.from_any(value)  # type: ignore[attr-defined]
    names = {flat_name(g): g.name for g in dataclasses.fields(group)}
    try:
        return group(**{names[k]: v for k, v in keywords.items()})
    except (TypeError, ValueError) as e:  # named as the caller named it
        raise renamed(e, {g: k for k, g in names.items()}) from e


_GROUPS: dict[str, type] = {
    f.name: f.type if isinstance(f.type, type) else globals()[f.type]
    for f in dataclasses.fields(EngineConfig)
    if f.name != "seed"
}


def _flat_keywords() -> dict[str, tuple[str, str | None]]:
    """flat keyword -> (engine field, group field; None: the whole group or a plain engine field)."""
    out: dict[str, tuple[str, str | None]] = {"seed": ("seed", None)}
    for f in dataclasses.fields(EngineConfig):
        if f.name == "seed":
            continue
        if FLAT in f.metadata:
            out[f.metadata[FLAT]] = (f.name, None)
        else:
            out.update({flat_name(g): (f.name, g.name) for g in dataclasses.fields(_GROUPS[f.name])})
    return out


FLAT_KEYWORDS = _flat_keywords()
