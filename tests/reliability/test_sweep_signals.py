"""A multirun parent that gets SIGTERM stops its job processes (no orphans) and exits 143."""

import json
import os
import subprocess
import sys
import textwrap
import time

import psutil

from ..runner.helpers import ROOT

PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from experiments.run.sweep_signals import install
    install(on_stopped=lambda: print("aggregated", flush=True), grace_s=5)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(job.pid, flush=True)
    time.sleep(60)
    """
)


def test_sigterm_stops_the_jobs_and_exits_143():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    job_pid = int(parent.stdout.readline())
    assert psutil.pid_exists(job_pid)
    parent.terminate()
    out, err = parent.communicate(timeout=30)
    assert parent.returncode == 143, err
    assert "aggregated" in out and "stopped 1 job processes" in err
    deadline = time.monotonic() + 5
    while psutil.pid_exists(job_pid) and psutil.Process(job_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the job outlived its parent"
        time.sleep(0.05)


def test_sigterm_to_a_slurm_local_sweep_leaves_no_job_running_and_keeps_what_was_measured(tmp_path):
    """The real thing: `run.py -m hydra/launcher=slurm_local` (submitit's local executor, the Slurm path's
    twin) with two jobs mid-replay; SIGTERM to the parent (what scancel or a closed session sends) ends it
    with 143, no job process outlives it, and each job that was replaying wrote its summary, interrupted.
    (A job still starting up when the signal lands has nothing measured: submitit's own handler ignores
    SIGTERM until the runner's takes over, and the parent kills it after its grace period.)"""
    sweep = tmp_path / "sweep"
    parent = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            "hydra/launcher=slurm_local",
            "model=tiny",
            "kernel=torch",
            "cache.num_blocks=512",
            "trace=synthetic",
            "trace.num_requests=2000",  # 400 s at rate 5: still replaying when signalled (max_duration_s 300)
            "trace.rate=5",
            "trace.prompt_len={dist:fixed,value:24}",
            "trace.output_len={dist:fixed,value:4}",
            "replay=open_loop",
            "replay.max_duration_s=300",
            "cache.block_size=8,16",
            f"hydra.sweep.dir={sweep}",
            "progress=false",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    try:
        deadline = time.monotonic() + 240
        replaying = lambda job: (
            "replaying" in (sweep / job / "run.log").read_text() if (sweep / job / "run.log").exists() else False
        )
        while not all(replaying(job) for job in ("0", "1")):
            assert parent.poll() is None, parent.communicate()
            assert time.monotonic() < deadline, "the jobs never started replaying"
            time.sleep(0.5)
        jobs = psutil.Process(parent.pid).children(recursive=True)
        assert jobs
        parent.terminate()
        out, err = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 143, err[-3000:]
    deadline = time.monotonic() + 10
    for job in jobs:
        while psutil.pid_exists(job.pid) and job.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"job process {job.pid} outlived the sweep"
            time.sleep(0.1)
    for job in ("0", "1"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["interrupted"] is True and summary["signal"] == "SIGTERM", summary
