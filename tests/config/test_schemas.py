"""The config groups' typed schemas (experiments/conf/schema.py, Hydra's ConfigStore): every option of a
typed group composes as its schema, the schema declares exactly the option's keys (it adds none to the
recorded config), and a value of the wrong type is refused when the config is composed, naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from experiments.conf.schema import SCHEMAS

CONF = Path(__file__).resolve().parents[2] / "experiments" / "conf"


@pytest.fixture(autouse=True, scope="module")
def hydra_initialized():
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        yield


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def declared(group: str, option: str) -> tuple[set[str], str | None]:
    """The keys an option's yaml files give (its own, its bases', groups placed in it) and its schema."""
    text = yaml.safe_load((CONF / group / f"{option}.yaml").read_text()) or {}
    keys, schema = set(text) - {"defaults"}, None
    for entry in text.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":  # a base option of the same group
            base_keys, base_schema = declared(group, entry)
            keys |= base_keys
            schema = schema or base_schema
        elif isinstance(entry, dict):
            ((target, choice),) = entry.items()
            if target == f"/schema/{group}@_here_":
                schema = choice
            else:  # another group placed under this one (parallel: /link@link)
                keys.add(target.rpartition("@")[2])
    return keys, schema


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_option_is_typed_by_a_schema_declaring_exactly_its_keys(group):
    for option in options(group):
        keys, schema = declared(group, option)
        assert schema in SCHEMAS[group], f"{group}/{option}.yaml names no schema of {sorted(SCHEMAS[group])}"
        fields = {f.name for f in dataclasses.fields(SCHEMAS[group][schema])}
        assert fields == keys, f"{group}={option}: schema {schema} differs by {sorted(fields ^ keys)}"
        context = ["executor=sim", "device=h100-sxm"] if group == "executor" and option == "sim" else []
        cfg = compose("config", overrides=[*context, f"{group}={option}"])
        assert OmegaConf.get_type(cfg[group]) is SCHEMAS[group][schema]
        assert set(cfg[group]) == keys


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["cache.block_size=abc"], "cache.block_size"),
        (["cache.prefix_caching=maybe"], "cache.prefix_caching"),
        (["cache=static_max", "cache.num_blocks=many"], "cache.num_blocks"),
        (["scheduler.max_num_seqs=many"], "scheduler.max_num_seqs"),
        (["scheduler=mlfq", "scheduler.preemption_mode=[swap]"], "scheduler.preemption_mode"),
        (["executor=sim", "device=h100-sxm", "executor.spec_acceptance=high"], "executor.spec_acceptance"),
        (["executor=host", "executor.step_time_s=slow"], "executor.step_time_s"),
        (["spec=ngram", "spec.num_speculative_tokens=x"], "spec.num_speculative_tokens"),
        (["cluster.replicas=two"], "cluster.replicas"),
        (["replay.repeats=x"], "replay.repeats"),
        (["server.port=http"], "server.port"),
        (["parallel.tensor_parallel_size=x"], "parallel.tensor_parallel_size"),
        (["kernel.name=[torch]"], "kernel.name"),
        (["trace=synthetic", "trace.rate=fast"], "trace.rate"),
        (["trace=azure", "trace.start=x"], "trace.start"),
        (["trace=sessions", "trace.think_s=[1]"], "trace.think_s"),
        (["model.name=[tiny]"], "model.name"),
        (["model=tiny", "model.hf_config=7"], "model.hf_config"),
    ],
)
def test_a_wrong_type_is_refused_at_compose_naming_the_key(overrides, key):
    with pytest.raises(ConfigCompositionException) as e:
        compose("config", overrides=overrides)
    assert key in f"{e.value} {e.value.__cause__}"


def test_user_options_still_take_new_keys():
    cfg = compose(
        "config",
        overrides=[
            "+scheduler.options.slack_s=0.01",
            "spec=ngram",
            "+spec.options={max_drafts:2}",
            "executor=sim",
            "device=h100-sxm",
            "+executor.cost_model_options={step_ms:5}",
            "cluster.router_options={key_blocks:4}",
        ],
    )
    assert cfg.scheduler.options.slack_s == 0.01 and cfg.spec.options.max_drafts == 2
    assert cfg.executor.cost_model_options.step_ms == 5 and cfg.cluster.router_options.key_blocks == 4


def test_schemas_declare_only_keys_the_settings_read():
    """A schema field no setting reads would be a key that changes nothing: each is one the run's
    settings map (experiments.run.engine_config.GROUP_FIELDS, experiments.run.settings' key tables, the
    dataclasses the cluster and the server are built from)."""
    from experiments.run.engine_config import GROUP_FIELDS
    from experiments.run.settings import REPLAY_KEYS, trace_options
    from testbed.cluster.config import ClusterConfig
    from testbed.server.settings import ServerSettings
    from testbed.sim.config import SimConfig
    from testbed.spec.config import SpeculativeConfig

    reads = {
        **{group: set(keys) for group, keys in GROUP_FIELDS.items()},
        "replay": set(REPLAY_KEYS),
        "cluster": {f.name for f in dataclasses.fields(ClusterConfig)},
        "server": {f.name for f in dataclasses.fields(ServerSettings)},
        "executor": {"name", "step_time_s", *(f.name for f in dataclasses.fields(SimConfig))},  # host: step_time_s
        "spec": {f.name for f in dataclasses.fields(SpeculativeConfig)},
        "trace": {key for name in SCHEMAS["trace"] for key in trace_options({"name": name})},
    }
    for group, schemas in SCHEMAS.items():
        for schema in schemas.values():
            fields = {f.name for f in dataclasses.fields(schema)}
            assert fields <= reads[group], f"{schema.__name__}: {sorted(fields - reads[group])} read by nothing"


def test_engine_schemas_are_derived_from_the_library_groups():
    """The engine groups' schemas are the library's group dataclasses (testbed.config): their keys, order and
    types, so a field added there is a typed key here (and mapped by experiments.run.engine_config)."""
    from experiments.conf.schema import fields_of, omegaconf_type
    from experiments.run.engine_config import GROUP_FIELDS
    from testbed.config import CacheConfig, HostTierConfig, ParallelConfig, SchedulerConfig, SimConfig

    def keys(schema):
        return [f.name for f in dataclasses.fields(schema)]

    cache = [f.name for f in dataclasses.fields(CacheConfig) if f.name != "host_tier"]
    host_tier = [f"host_tier_{f.name}" for f in dataclasses.fields(HostTierConfig)]
    assert keys(SCHEMAS["cache"]["paged"]) == cache + host_tier
    assert keys(SCHEMAS["cache"]["static"]) == [k for k in cache if k != "dtype"]
    scheduler = [f.name for f in dataclasses.fields(SchedulerConfig) if f.name != "async_scheduling"]
    assert keys(SCHEMAS["scheduler"]["default"]) == scheduler
    assert keys(SCHEMAS["parallel"]["default"]) == ["link", *(f.name for f in dataclasses.fields(ParallelConfig))]
    sim = [f.name for f in dataclasses.fields(SimConfig) if f.name not in ("device", "cost_model_options")]
    assert keys(SCHEMAS["executor"]["sim"]) == ["name", *sim]
    for group, library in (("cache", CacheConfig), ("scheduler", SchedulerConfig), ("parallel", ParallelConfig)):
        mapped = set(GROUP_FIELDS[group].values())  # config key -> "group.field" (None: read elsewhere)
        assert {f"{group}.{f.name}" for f in dataclasses.fields(library) if f.name != "host_tier"} <= mapped
    types = {f.name: f.type for f in dataclasses.fields(SCHEMAS["cache"]["paged"])}
    assert types["block_size"] is int and types["num_blocks"] == omegaconf_type(int | None)
    assert types["host_tier_link"] is Any and types["memory_gb"] is float  # `str | dict`: no union in OmegaConf

    @dataclasses.dataclass
    class WithKnob(CacheConfig):
        new_knob: int | None = 3

    assert fields_of(WithKnob)[-1][:2] == ("new_knob", omegaconf_type(int | None))


def test_trace_schemas_are_the_options_their_loaders_take():
    """Each trace format's schema declares exactly the keys its loader takes (experiments.traces,
    experiments.sessions) with the loader's defaults, and every option of the model group (the library's
    sheets, testbed/specs/model) composes as the model schema (typed from testbed.config.ModelConfig)."""
    from experiments.run.settings import trace_options
    from testbed.specs import builtin_names

    for name, schema in SCHEMAS["trace"].items():
        loader = trace_options({"name": name})
        built = OmegaConf.to_container(OmegaConf.structured(schema))
        assert set(built) == set(loader), name
        derived = ("path", "zero_length")  # the yaml gives the path; the loader fills zero_length from overlength
        assert {k: v for k, v in built.items() if k not in derived} == {k: loader[k] for k in built if k not in derived}
    for name in builtin_names("model"):
        cfg = compose("config", overrides=[f"model={name}"])
        assert OmegaConf.get_type(cfg.model) is SCHEMAS["model"]["default"]


def test_cluster_server_and_replay_schemas_are_derived_from_their_settings():
    """One declaration per key set: the cluster's, the server's and the replay's schema are the fields of the
    objects run_settings builds or checks (ClusterConfig, ServerSettings, ReplayOptions), in their order."""
    from experiments.replay.options import ReplayOptions
    from experiments.run.settings import REPLAY_KEYS
    from testbed.cluster.config import ClusterConfig
    from testbed.server.settings import ServerSettings

    for group, source in (("cluster", ClusterConfig), ("server", ServerSettings), ("replay", ReplayOptions)):
        assert [f.name for f in dataclasses.fields(SCHEMAS[group]["default"])] == [
            f.name for f in dataclasses.fields(source)
        ], group
    assert list(REPLAY_KEYS) == [f.name for f in dataclasses.fields(ReplayOptions)]
    types = {f.name: f.type for f in dataclasses.fields(SCHEMAS["cluster"]["default"])}
    assert types["router_options"] is Any and types["backends"] == list[str]  # a mapping replaced whole
