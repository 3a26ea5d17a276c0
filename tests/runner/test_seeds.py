"""Seeds: every seed-like key of conf/ is in experiments.statistics.seeds.SEED_KEYS (each option of each group
composed), config_id ignores them, and a repeat redraws the workload when replay.redraw_workload says so."""

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from experiments.run.repeats import repeat_configs, repeat_count
from experiments.statistics.seeds import SEED_KEYS, WORKLOAD_SEEDS, config_id, redraw_workload

from ..composed import composed
from .helpers import ROOT

CONF = ROOT / "experiments" / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "hydra")


def _options():
    return [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml")) if f.stem != "base"]


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _compose(*overrides):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _compose_option(group: str, option: str):
    """The config with one group option chosen (added, for a group outside the defaults list); inside an
    initialize_config_module context. As test_every_leaf composes them (progress off): composed once."""
    if not group:
        return composed("progress=false")
    try:
        return composed("progress=false", f"{group}={option}")
    except ConfigCompositionException:
        return composed("progress=false", f"+{group}={option}")


def test_every_seed_key_of_conf_is_listed():
    """Compose every option of every group (and the defaults): a key whose name says seed is in SEED_KEYS,
    and changing it leaves config_id alone."""
    seen = set()
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        composed = [(g, o, _compose_option(g, o)) for g, o in [("", "")] + _options()]
    for group, option, cfg in composed:
        resolved = OmegaConf.to_container(cfg, resolve=True)
        for path, value in _leaves(resolved):
            name = path.rsplit(".", 1)[-1]
            if "seed" not in name or name == "repeat_seeds":
                continue
            assert path in SEED_KEYS, (
                f"{group}={option}: {path} is seed-like but not in experiments.statistics.seeds.SEED_KEYS"
            )
            seen.add(path)
            changed = OmegaConf.to_container(cfg, resolve=True)
            node = changed
            *parents, last = path.split(".")
            for part in parents:
                node = node[part]
            node[last] = (value or 0) + 17
            assert config_id(changed) == config_id(resolved), f"{group}={option}: {path}"
    assert seen == set(SEED_KEYS)  # the list holds nothing conf/ does not have


def test_config_id_ignores_seeds_repeats_and_outputs():
    base = {"scheduler": {"name": "fcfs"}, "seed": 0, "trace": {"name": "synthetic", "seed": 0}, "replay": {}}
    same = [
        {**base, "seed": 3},
        {**base, "trace": {"name": "synthetic", "seed": 9}},
        {**base, "replay": {"repeat": 2, "repeats": 3, "redraw_workload": False}},  # null resolves to false here
        {**base, "results": {"sweep_table": "/x"}, "progress": False},
    ]
    assert all(config_id(c) == config_id(base) for c in same)
    assert config_id({**base, "scheduler": {"name": "sjf"}}) != config_id(base)
    assert config_id({**base, "replay": {"redraw_workload": True}}) != config_id(base)
    custom = {**base, "spec": {"seed": 1}, "replay": {"repeat_seeds": ["seed", "spec.seed"]}}
    assert config_id(custom) == config_id({**custom, "spec": {"seed": 2}})


def test_redraw_default_is_by_executor():
    assert redraw_workload({"executor": {"name": "sim"}, "replay": {"redraw_workload": None}})
    assert not redraw_workload({"executor": {"name": "real"}, "replay": {"redraw_workload": None}})
    named = {"executor": {"name": "host"}, "replay": {"redraw_workload": None, "repeat_seeds": ["trace.seed"]}}
    assert redraw_workload(named)
    with pytest.raises(ValueError, match="replay.redraw_workload"):
        redraw_workload({"replay": {"redraw_workload": "yes"}})


def test_repeats_redraw_the_workload_when_asked():
    """Simulated repeats offset seed, executor.seed (it follows seed) and trace.seed; real ones only seed;
    true / false override either; every repeat records the value it ran with."""
    sim = repeat_configs(_compose("executor=sim", "device=h100-sxm", "trace=synthetic", "seed=5"), 3)
    assert [(c.seed, c.executor.seed, c.trace.seed, c.replay.redraw_workload) for c in sim] == [
        (5, 5, 0, True),
        (6, 6, 1, True),
        (7, 7, 2, True),
    ]
    real = repeat_configs(_compose("trace=synthetic", "seed=5"), 2)
    assert [(c.seed, c.trace.seed, c.replay.redraw_workload) for c in real] == [(5, 0, False), (6, 0, False)]
    real = repeat_configs(_compose("trace=synthetic", "replay.redraw_workload=true", "scheduler=priority"), 2)
    assert [(c.trace.seed, c.scheduler.options.seed) for c in real] == [(0, 0), (1, 1)]
    assert set(WORKLOAD_SEEDS) <= set(SEED_KEYS)
    with pytest.raises(ConfigCompositionException, match="replay.redraw_workload"):  # typed: refused at compose
        _compose("trace=synthetic", "replay.redraw_workload=sometimes")
    plain = OmegaConf.to_container(_compose("trace=synthetic"))  # run_trace's Hydra-free input: checked there
    plain["replay"]["redraw_workload"] = "sometimes"
    with pytest.raises(ValueError, match="replay.redraw_workload: must be"):
        repeat_count(OmegaConf.create(plain))
    with pytest.raises(ValueError, match="redraw_workload=false"):
        repeat_configs(
            _compose("trace=synthetic", "replay.redraw_workload=false", "replay.repeat_seeds=[seed,trace.seed]"), 2
        )
