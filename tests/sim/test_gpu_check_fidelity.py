"""experiments/gpu_check.sh's fidelity step on the CPU paths: the same commands a lent GPU runs (a forced
quick calibration, then a reduced fidelity study on its profile), on the tiny model, small."""

import json
import os
import shutil
import subprocess

import pandas as pd
import pytest

from ..runner.helpers import ROOT


@pytest.mark.slow  # ~15 s quiet, ~1 min on a loaded 2-core VM; the study's code path is in the default run
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_fidelity_step_on_cpu(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "STEPS": "fidelity",
        "OMP_NUM_THREADS": "1",  # a shared CPU: intra-op threads only spin against each other
        "TESTBED_KERNEL": "torch",
        "FID_DEVICE": "cpu",
        "FID_MODEL": "tiny",
        "FID_KERNEL": "torch",
        "FID_DTYPE": "float32",
        "FID_SCALE": "0.07",
        "FID_ARGS": "cache.num_blocks=128 replay.max_output_tokens=6",
        "FID_STUDY_ARGS": "--repeats 2 --concurrency 2 --loads 1.0",
    }
    done = subprocess.run(
        ["bash", "experiments/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "calibration: rc=0" in done.stdout and "fidelity (reduced): rc=0" in done.stdout, done.stdout[-3000:]
    (profile,) = (tmp_path / "profiles").glob("*.json")
    meta = json.loads(profile.read_text())
    assert meta["model"] == "tiny" and meta["self_check"]["forced"] and meta["operators"]["layers"] == 2
    figs = pd.read_csv(tmp_path / "fidelity" / "figures.csv")
    assert set(figs["cell"]) == {"synthetic_closed_c2", "synthetic_open_100pct"}
    assert set(figs["cost_model"]) == {"profile", "operators"} and (figs["real_n"] == 2).all()
    assert "executor.cost_model=profile (SIMULATED)" in done.stdout  # the summary's table, printed last
