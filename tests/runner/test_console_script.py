"""`testbed-run` works from any directory: the console script imports run.py as a module (`from run import
main`), and Hydra must still find its config (package data: experiments.conf). Run here as the script pip
generates, from a temp dir."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def console_script(name: str) -> str:
    """The Python that pip's wrapper for [project.scripts] `name` runs."""
    text = (ROOT / "pyproject.toml").read_text()
    module, func = re.search(rf'^{name}\s*=\s*"([\w.]+):(\w+)"', text, re.MULTILINE).groups()
    return f"import sys; from {module} import {func}; sys.exit({func}())"


def run_testbed_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH stands in for the editable install (which maps the module `run` to run.py, nothing else)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-c", console_script("testbed-run"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_help_outside_the_repo(tmp_path):
    proc = run_testbed_run("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "model: " in proc.stdout and "tiny" in proc.stdout  # the config groups were found


def test_tiny_replay_outside_the_repo(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_testbed_run(
        "model=tiny",
        "cache.num_blocks=256",
        "trace=synthetic",
        "trace.num_requests=2",
        "replay.max_prompt_tokens=16",
        "replay.max_output_tokens=4",
        "progress=false",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["completed"] == 2
