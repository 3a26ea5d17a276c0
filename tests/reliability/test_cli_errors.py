"""A refused config is one clear line on stderr (exit 2), before any model loads; the traceback only with
HYDRA_FULL_ERROR=1, as Hydra does."""

import os
import re
import subprocess
import sys

import pytest

from ..runner.helpers import ROOT


def run(*overrides, full_error: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    if full_error:
        env["HYDRA_FULL_ERROR"] = "1"
    return subprocess.run(
        [sys.executable, "run.py", *overrides, "hydra.run.dir=/tmp/testbed-cli-errors"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


MORE = [
    ("cache.block_size=0", "cache.block_size"),
    ("structured_outputs.compile_timeout_s=0", "structured_outputs.compile_timeout_s"),
]


@pytest.mark.parametrize(
    "override,message",
    # the other two through run.py only with -m slow: test_refused_where_run_py_makes_it_one_line checks them
    # in this process by default
    [("server.port=99999", "server.port must be in [0, 65535]")]
    + [pytest.param(*m, marks=pytest.mark.slow) for m in MORE],
)
def test_config_error_is_one_line(override, message):
    proc = run("mode=serve", override)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize("override,message", MORE)
def test_refused_where_run_py_makes_it_one_line(override, message):
    """run.py turns what run_settings raises (ValueError, TypeError, KeyError) into one line and exit 2
    (test_config_error_is_one_line shows that path once); each of these refusals is raised there, naming its key."""
    from hydra import compose, initialize_config_module

    from experiments.run.settings import run_settings

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = compose("config", overrides=["mode=serve", override])
    with pytest.raises((ValueError, TypeError, KeyError), match=re.escape(message)):
        run_settings(cfg)


def test_full_error_shows_the_traceback():
    proc = run("mode=serve", "server.port=99999", full_error=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr
