"""Every leaf of conf/ counts: for the composed default config and for each option of each group (found
by listing conf/ and testbed/specs/, so a group or option added later is covered), every leaf is changed
to another valid value and the settings a run is built from (experiments.run.settings.RunSettings: the
EngineConfig with its spec sheets, the cluster with its link, the trace's, replay's and workload's checked
options, SLOs, server) must change. A leaf that changes nothing is a silently dropped override.

Values: booleans flip, numbers scale; strings, nulls and lists take their candidates from ALTERNATIVES (a
new string key needs an entry: that is the point). Interpolations (`${seed}`, `${link}`) are derived: the
leaf they point to is the one tested. A group's identity leaf (`name`, spec `method`) passes when it is
live in some option of its group (alone, it can contradict the option's other keys).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from hydra import initialize_config_module
from omegaconf import DictConfig, ListConfig, OmegaConf

from experiments.run.settings import run_settings
from experiments.traces import TraceError

from ..composed import composed as composed_once

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "experiments" / "conf"
SPECS = ROOT / "testbed" / "specs"

# Run-level leaves: they change where results go or how a run is shown, not what runs.
RUN_LEVEL = [
    "experiment",  # the results folder's name (results/<experiment>/) and W&B group
    "progress",  # the tqdm bar
    "results.*",  # where the sweep table goes
    "wandb.*",  # Weights & Biases logging
    "priority_high_share",  # read by scheduler=priority's options.high_share (an interpolation there)
]
# Candidate values for leaves whose other value cannot be guessed from their type (first valid one wins).
ALTERNATIVES = {
    "mode": ["offline", "replay"],
    "dtype": ["float16"],
    "max_model_len": [256],
    "model.name": ["tiny", "my-model"],
    "model.hf_config.*": ["qwen3", 7, [7], {"rope_type": "default"}],
    "kernel.name": ["torch", "cpu"],
    "device.name": ["my-gpu"],
    "device.torch_device": ["cpu", "cuda"],
    "device.source": ["measured"],
    "executor.name": ["host", "real"],
    "executor.cost_model": ["roofline", "profile"],
    "executor.profile": ["other.json"],
    "executor.run": ["results/x/run"],
    "scheduler.name": ["sjf", "fcfs"],
    "scheduler.preemption_mode": ["recompute", "swap"],
    "scheduler.options.by": ["prompt"],
    "scheduler.options.preemption": ["waiting"],
    "scheduler.options.*": [None],
    "cache.name": ["paged", "static_max"],
    "cache.num_blocks": [64],
    "cache.num_cpu_blocks": [8],
    "cache.dtype": ["float16"],
    "cache.eviction": ["lfu"],
    "cache.host_tier_gb": [0.5],
    "cache.host_tier_blocks": [64],
    "cache.host_tier_write": ["through"],
    "cache.host_tier_link": ["nvlink"],
    "spec.method": ["ngram", "layerskip"],
    "spec.model": ["tiny"],
    "spec.num_layers": [12],
    "trace.name": ["synthetic", "azure"],
    "trace.path": ["other.csv"],
    "trace.window": [[0, 100]],
    "trace.overlength": ["skip"],
    "trace.zero_length": ["skip", "clip"],
    "trace.max_requests": [10],
    "trace.rate": [5.0],
    "trace.horizon_s": [3600],
    "trace.output_len": [64, {"dist": "uniform", "low": 8, "high": 64}],
    "trace.prompt_len": [{"dist": "uniform", "low": 8, "high": 64}],
    "trace.models": [["GPT-4"]],
    "trace.log_types": [["API log"]],
    "trace.think_dist": ["fixed"],
    "trace.session_rate": [2.0],
    "trace.max_sessions": [4],
    "trace.max_turns": [3],
    "trace.turns": [[1, 3], 2],
    "trace.first_tokens": [[8, 16]],
    "trace.new_tokens": [[8, 16]],
    "trace.output_tokens": [[8, 16]],
    "replay.name": ["open_loop", "offline"],
    "replay.concurrency": [4],
    "replay.max_prompt_tokens": [16],
    "replay.max_output_tokens": [16],
    "replay.max_duration_s": [60.0],
    "replay.repeat_seeds": [["seed", "trace.seed"]],
    "replay.repeat": [1],
    "replay.redraw_workload": [True, False],
    "slo.*": [100.0],
    "metrics.percentiles": [[50, 95]],
    "cluster.router": ["random"],
    "cluster.decode_router": ["round_robin"],
    "cluster.router_options": [{"key_blocks": 4}],
    "cluster.backends": [["http://127.0.0.1:9"]],
    "cluster.threads_per_replica": [2],
    "link.name": ["my-link"],
    "link.source": ["measured"],
    "parallel.link.name": ["my-link"],
    "parallel.link.source": ["measured"],
    "server.host": ["0.0.0.0"],
    "server.api_key": ["secret"],
    "server.served_model_name": ["served"],
    "server.log_level": ["debug"],
    "server.tool_parser": ["llama3_json", None],
    "server.json_max_whitespace": [None],
}
IDENTITY = ("name", "method")  # a group option's identity: live when its options build distinct settings
# Each option is tried in these contexts until its leaves are shown live (a device's sheet is read only
# by the simulator, a link only by a P/D cluster); a context the option cannot build in is skipped.
CONTEXTS = [
    [],
    ["executor=sim", "device=h100-sxm", "model=llama-3.1-8b", "trace=synthetic", "cluster=pd"],
    ["executor=sim", "executor.cost_model=profile", "executor.profile=p.json", "device=h100-sxm"],
]


def groups() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for base in (CONF, SPECS):
        for folder in sorted(p for p in base.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__")):
            out.setdefault(folder.name, []).extend(sorted(f.stem for f in folder.glob("*.yaml")))
    return out


@pytest.fixture(autouse=True, scope="module")
def hydra_initialized():
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):  # once: initialising is slow
        yield


def composed(*overrides):
    return composed_once("progress=false", *overrides)


def leaves(node: DictConfig, prefix: str = ""):
    for key in node:
        path = f"{prefix}{key}"
        child = node._get_node(key)
        if child._is_interpolation():
            if str(child._value()).startswith("${oc.create:"):  # a value form: one leaf
                yield path
        elif isinstance(child, DictConfig) and not child._is_none():
            yield from leaves(child, path + ".")
        else:
            yield path


def candidates(path: str, value) -> list:
    for pattern, values in ALTERNATIVES.items():
        if fnmatch.fnmatchcase(path, pattern):
            return [v for v in values if v != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value * 2, value + 1, value - 1]
    if isinstance(value, float):
        return [v for v in (value * 2, value / 2, value + 0.5) if v != value]
    return []


def based_on(group: str, a: str, b: str) -> bool:
    """Whether option a or b lists the other in its defaults (replay/base.yaml under offline.yaml)."""
    import yaml

    for this, other in ((a, b), (b, a)):
        for base in (CONF, SPECS):
            path = base / group / f"{this}.yaml"
            if path.exists() and other in (yaml.safe_load(path.read_text()) or {}).get("defaults", []):
                return True
    return False


def run_level(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in RUN_LEVEL)


def live(cfg: DictConfig, path: str, base) -> tuple[bool, list[str]]:
    """Whether some candidate value of `path` builds settings that differ from `base` (and why not)."""
    value = OmegaConf.select(cfg, path)
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    parent_path, _, key = path.rpartition(".")
    parent = OmegaConf.select(cfg, parent_path) if parent_path else cfg
    raw = parent._get_node(key)._value()
    raw = OmegaConf.to_container(raw) if isinstance(raw, (DictConfig, ListConfig)) else raw
    why = []
    for new in candidates(path, value):
        try:
            parent[key] = new
            built = run_settings(cfg)
        except Exception as e:  # refused: try the next candidate
            why.append(f"{new!r}: {type(e).__name__}: {str(e)[:160]}")
            continue
        finally:
            parent[key] = raw
        if built != base:
            return True, why
        why.append(f"{new!r}: builds the same settings")
    return False, why or ["no candidate value (add one to ALTERNATIVES)"]


_BUILT: dict = {}  # (overrides, context index) -> (cfg, settings) or None where it does not build
_REFUSED: dict = {}  # (overrides, context index) -> why it does not build


def built_in(overrides: tuple, index: int):
    if (overrides, index) not in _BUILT:
        try:
            cfg = composed(*CONTEXTS[index], *overrides)
            _BUILT[overrides, index] = (cfg, run_settings(cfg))
        except Exception as e:
            _BUILT[overrides, index] = None
            _REFUSED[overrides, index] = f"{type(e).__name__}: {e}"
    return _BUILT[overrides, index]


def check(overrides: tuple, scope: str | None, proven: set[str], failures: dict[str, list[str]]):
    """Leaves of cfg[scope] (the whole config if None) not yet proven live: try them in each context."""
    pending = None
    for index in range(len(CONTEXTS)):
        if built_in(overrides, index) is None:
            continue
        cfg, base = built_in(overrides, index)
        node = cfg if scope is None else cfg[scope]
        paths = [p if scope is None else f"{scope}.{p}" for p in leaves(node)]
        if pending is None:
            pending = [p for p in paths if not run_level(p) and p not in proven and not identity(p)]
        for path in [p for p in pending if p in paths]:
            ok, why = live(cfg, path, base)
            if ok:
                proven.add(path)
                pending.remove(path)
                failures.pop(path, None)
            else:
                failures.setdefault(path, []).extend(f"[{' '.join(overrides) or 'default'}] {w}" for w in why)
        if not pending:
            break
    assert pending is not None, f"{overrides} builds in no context: {[_REFUSED[overrides, i] for i in range(3)]}"


def identity(path: str) -> bool:
    return path.count(".") == 1 and path.rsplit(".", 1)[-1] in IDENTITY


def distinct(a: tuple, b: tuple) -> bool:
    """Whether two options build different settings in some context where both build."""
    for index in range(len(CONTEXTS)):
        x, y = built_in(a, index), built_in(b, index)
        if x is not None and y is not None and x[1] != y[1]:
            return True
    return False


def test_every_leaf_of_every_option_changes_what_is_built():
    proven: set[str] = set()
    failures: dict[str, list[str]] = {}
    check((), None, proven, failures)
    same = []
    for group, options in groups().items():
        for option in options:
            check((f"{group}={option}",), None if group == "experiment" else group, proven, failures)
        for i, a in enumerate(options):
            for b in options[i + 1 :]:
                if not based_on(group, a, b) and not distinct((f"{group}={a}",), (f"{group}={b}",)):
                    same.append((group, a, b))
    assert not same, f"options that build the same settings: {same}"
    assert not failures, "leaves that change nothing:\n" + "\n".join(
        f"{p}: {w[:3]}" for p, w in sorted(failures.items())
    )


def test_unknown_keys_and_bad_values_are_refused_naming_the_key():
    for override, key in [
        ("cache.blok_size=8", "cache.blok_size"),
        ("+cache.blok_size=8", "cache.blok_size"),
        ("cache.block_size=abc", "cache.block_size"),
        ("cache.block_size=0", "cache.block_size"),
        ("replay.length_scale=-1", "replay.length_scale"),
        ("device.hbm_bandwidth_gbs=0", "device.hbm_bandwidth_gbs"),
        ("executor.spec_acceptance=2", "executor.spec_acceptance"),
        ("executor.cost_scale=0", "executor.cost_scale"),
        ("+replay.concurency=4", "replay.concurency"),
        ("+max_num_seqs=8", "max_num_seqs"),
        ("model.hf_config.num_hidden_layers=abc", "model.hf_config: num_hidden_layers"),
        ("model.hf_config.head_dim=0", "model.hf_config: head_dim"),
    ]:
        with pytest.raises(Exception, match=key.replace(".", r"\.")):
            run_settings(composed("executor=sim", "device=h100-sxm", "model=tiny", override))


def test_bad_trace_values_are_refused_before_the_run_naming_the_key():
    """What a trace loader would refuse and needs no file is refused by run_settings, before an engine."""
    for overrides, key in [
        (("trace=synthetic", "trace.rate=0"), "rate"),
        (("trace=synthetic", "trace.rate=-2"), "rate"),
        (("trace=synthetic", "trace.burstiness=0"), "burstiness"),
        (("trace=synthetic", "trace.num_requests=0"), "num_requests"),
        (("trace=sharegpt_synthetic", "trace.rate=0"), "rate"),
        (("trace=sharegpt", "trace.rate=0"), "rate"),
        (("trace=sharegpt", "trace.output_len=0"), "output_len"),
        (("trace=sessions", "trace.session_rate=0"), "session_rate"),
        (("trace=sessions", "trace.think_s=-1"), "think_s"),
        (("trace=sessions", "trace.turns=0"), "turns"),
        (("trace=sharegpt_sessions", "trace.rate=0"), "rate"),
        (("trace=sharegpt_sessions", "trace.max_turns=0"), "max_turns"),
    ]:
        with pytest.raises(TraceError, match=f"field '{key}'"):
            run_settings(composed(*overrides))


def test_value_forms_the_docs_give_are_plain_overrides():
    cfg = composed("trace=synthetic", "trace.prompt_len={dist:uniform,low:32,high:256}")
    assert run_settings(cfg).trace["prompt_len"] == {"dist": "uniform", "low": 32, "high": 256}
    for form, value in [
        ("{dist:fixed,value:64}", {"dist": "fixed", "value": 64}),
        ("{dist:lognormal,median:100,sigma:0.5}", {"dist": "lognormal", "median": 100, "sigma": 0.5}),
        ("{dist:zipf,a:1.5,low:1,high:64}", {"dist": "zipf", "a": 1.5, "low": 1, "high": 64}),
    ]:
        assert run_settings(composed("trace=synthetic", f"trace.output_len={form}")).trace["output_len"] == value
    cfg = composed("model=tiny", "model.hf_config.num_hidden_layers=1")
    assert run_settings(cfg).engine.model.hf_config["num_hidden_layers"] == 1
    cfg = composed("+model.hf_config.num_hidden_layers=3")
    assert run_settings(cfg).engine.model.hf_config == {"num_hidden_layers": 3}
    cfg = composed("trace=sharegpt_synthetic", "trace.output_len={dist:fixed,value:7}")
    assert run_settings(cfg).trace["output_len"] == {"dist": "fixed", "value": 7}
    cfg = composed("cluster.router=prefix_affinity", "cluster.router_options={key_blocks:4,load_factor:1.5}")
    assert run_settings(cfg).cluster.router_options == {"key_blocks": 4, "load_factor": 1.5}
    cfg = composed("cluster.link={name:slow,bandwidth_gbs:1,latency_us:2}")
    assert run_settings(cfg).cluster.link.bandwidth_gbs == 1
