"""The built-in device, link and model sheets have one source (testbed/specs/, package data), which is both
Hydra's config groups and what the library reads for a bare name; a non-editable install has them."""

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from testbed.cluster.links import load_link
from testbed.models.registry import BUILTIN, resolve_model
from testbed.sim.devices import load_device
from testbed.specs import GROUPS, builtin_names, builtin_spec

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def composed(group, name):
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={name}"])
    return OmegaConf.to_container(cfg[group], resolve=True)


def test_conf_has_no_second_copy_of_the_builtin_groups():
    for group in GROUPS:
        conf_group = ROOT / "experiments" / "conf" / group
        assert not conf_group.exists(), f"experiments/conf/{group}/ would drift from testbed/specs/{group}/"
        assert builtin_names(group), group


@pytest.mark.parametrize("group", GROUPS)
def test_hydra_composes_exactly_the_library_builtins(group):
    for name in builtin_names(group):
        assert composed(group, name) == builtin_spec(group, name), (group, name)


def test_a_name_and_its_composed_values_build_the_same_spec():
    sheets = [n for n in builtin_names("device") if "memory_gb" in builtin_spec("device", n)]
    assert {"h100-sxm", "h200", "a100-80g", "l4"} <= set(sheets)
    for name in sheets:
        assert load_device(name) == load_device(composed("device", name))
    for name in builtin_names("link"):
        assert load_link(name) == load_link(composed("link", name))
    for name in builtin_names("model"):
        if name in BUILTIN:  # real weights: its config.json
            continue
        values = composed("model", name)
        assert resolve_model(name).hf_config == resolve_model(name, values["hf_config"]).hf_config
        assert resolve_model("my-own-name", values["hf_config"]).hf_config == values["hf_config"]


def test_package_data_ships_every_builtin_sheet():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["testbed"]
    for group in GROUPS:
        for name in builtin_names(group):
            rel = f"specs/{group}/{name}.yaml"
            assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


@pytest.mark.slow
def test_a_non_editable_install_runs_builtin_names_outside_the_checkout(tmp_path):
    """pip install . (no -e) into a fresh target folder; the library, run from elsewhere, finds its sheets."""
    source, target = tmp_path / "src", tmp_path / "site"
    source.mkdir()  # a copy of the sources: setuptools leaves a build/ folder in the tree it builds
    for name in ("pyproject.toml", "run.py", "serve.py", "testbed", "testbed_kernels", "experiments", "benchmarks"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, source],
        check=True,
        cwd=tmp_path,
    )
    code = (
        "import testbed, json; from testbed import LLM, SamplingParams;"
        "assert 'site' in testbed.__file__, testbed.__file__;"
        "llm = LLM(model='llama-3.2-1b', executor='sim', sim_config={'device': 'h100-sxm'}, num_blocks=64);"
        "out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True));"
        "print(len(out[0].outputs[0].token_ids));"
        "real = LLM(model='smollm2-135m', num_blocks=32);"
        "print(real.generate(['Hi'], SamplingParams(max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sim_tokens, real_tokens = proc.stdout.strip().splitlines()[-2:]
    assert sim_tokens == "3" and len(json.loads(real_tokens)) == 2
