"""A multirun parent that gets SIGTERM stops its job processes (no orphans) and exits 143."""

import subprocess
import sys
import textwrap
import time

import psutil

from ..runner.helpers import ROOT

PARENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from experiments.sweep_signals import install
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
