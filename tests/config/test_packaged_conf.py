"""The runner's Hydra config tree is package data (experiments/conf, the module `experiments.conf`): no
module reads a conf/ folder by file name, and every file of the tree ships in the wheel."""

import ast
import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "experiments" / "conf"
SOURCES = ["testbed", "experiments", "benchmarks", "testbed_kernels", "hydra_plugins", "run.py", "serve.py"]


def _modules():
    for name in SOURCES:
        path = ROOT / name
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _is_conf_path(node: ast.AST) -> bool:
    """A string literal naming a conf/ folder or file: "conf" joined onto a path, or "x/conf/y" (no spaces)."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or any(c.isspace() for c in node.value):
        return False
    return "conf" in node.value.replace("\\", "/").split("/")


def _reads_conf_by_path(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.Attribute):  # the by-path compose API
            if (node.id if isinstance(node, ast.Name) else node.attr) == "initialize_config_dir":
                found.append("initialize_config_dir")
        elif isinstance(node, ast.keyword) and node.arg == "config_dir":
            found.append("config_dir=")
        elif (
            isinstance(node, ast.keyword)
            and node.arg == "config_path"
            and not (isinstance(node.value, ast.Name) and node.value.id == "CONFIG_PATH")
        ):
            found.append("config_path= other than experiments.conf.CONFIG_PATH")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_conf_path(node.right):
            found.append(f"/ {node.right.value!r}")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Constant) and _is_conf_path(node) and "/" in node.value:
            found.append(repr(node.value))
    return found


def test_no_module_reads_conf_by_path():
    offenders = {}
    for path in _modules():
        found = _reads_conf_by_path(ast.parse(path.read_text(), str(path)))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"compose the packaged config (experiments.conf), never conf/ by path: {offenders}"
    assert not (ROOT / "conf").exists(), "a conf/ folder at the root would not ship with the package"


def test_the_check_catches_each_by_path_form():
    for code in (
        'initialize_config_dir(config_dir=str(ROOT / "conf"))',
        'hydra.main(config_path="conf", config_name="config")',
        'open(ROOT / "conf/trace/azure.yaml")',
        'p = Path(__file__).parent / "conf"',
    ):
        assert _reads_conf_by_path(ast.parse(code)), code
    prose = 'hydra.main(config_path=CONFIG_PATH); x = "conf"; """Overrides of conf/config.yaml."""'
    assert not _reads_conf_by_path(ast.parse(prose))


def test_package_data_ships_the_whole_config_tree():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["experiments"]
    files = [p.relative_to(CONF.parent).as_posix() for p in CONF.rglob("*") if p.is_file() and p.suffix != ".pyc"]
    assert any(f.endswith(".yaml") for f in files)
    for rel in files:
        assert rel.endswith(".py") or any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} would not ship"


@pytest.mark.slow
def test_testbed_run_from_a_wheel_outside_the_checkout(tmp_path):
    """A built wheel in a fresh venv (system site packages stand in for the dependencies): `testbed-run`
    composes its config from the package and runs a tiny simulated replay from an unrelated directory."""
    source = tmp_path / "src"
    source.mkdir()  # a copy: setuptools leaves build/ in the tree it builds
    for name in ("pyproject.toml", *SOURCES):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, source]
    subprocess.run(pip, check=True, cwd=tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    wheel = next(wheels.glob("testbed-*.whl"))
    subprocess.run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", wheel], check=True, cwd=tmp_path)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"WANDB_MODE": "disabled"}
    where = subprocess.run(
        [bin_dir / "python", "-c", "import experiments.conf as c, run; print(c.__file__); print(run.__file__)"],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the installed copy, not the checkout
    run_dir = away / "run"
    proc = subprocess.run(
        [
            bin_dir / "testbed-run",
            "executor=sim",
            "device=h100-sxm",
            "model=llama-3.2-1b",
            "trace=synthetic",
            "trace.num_requests=3",
            "progress=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    assert json.loads((run_dir / "summary.json").read_text())["completed"] == 3
