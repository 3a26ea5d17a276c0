"""A multirun parent that gets SIGTERM or SIGHUP (scancel, a closed terminal, `kill`) passes it on to its
job processes (local launchers such as slurm_local and the parallel launcher run them as children) so
none is left running as an orphan: each job's runner then writes what it measured, marked interrupted
(experiments.run.stop_signals); stragglers are killed after `grace_s`, then `on_stopped` runs (the sweep's
aggregate) and the parent exits 128 + signum. SIGINT (Ctrl-C) already reaches the whole process group."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable

import psutil

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def stop_jobs(signum: int, grace_s: float = 20.0) -> int:
    """Send signum to every descendant process, kill those alive after grace_s; how many there were."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signum)
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    return len(children)


def install(on_stopped: Callable[[], None] | None = None, grace_s: float = 20.0) -> None:
    """In the multirun parent (main thread only): SIGTERM / SIGHUP stop the jobs, then exit."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum, _frame):
        n = stop_jobs(signum, grace_s)
        print(f"{signal.Signals(signum).name}: stopped {n} job processes", file=sys.stderr)
        if on_stopped is not None:
            on_stopped()
        sys.exit(128 + signum)

    for sig in SIGNALS:
        signal.signal(sig, handle)
