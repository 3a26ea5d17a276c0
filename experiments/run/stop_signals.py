"""Signals that stop a run the way Ctrl-C does: SIGINT, SIGTERM (Slurm's scancel and time limit, `docker
stop`) and SIGHUP (a closed terminal) raise RunInterrupted where the replay is, once; the runners then abort
what is in flight and write what was measured."""

from __future__ import annotations

import signal
import threading

# Signals that stop a run the way Ctrl-C does (SIGHUP does not exist on Windows).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal; `signum` says which (the exit status is 128 + signum)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP while a replay runs: the first one raises RunInterrupted where the replay
    is; from then on (and after `defer()`) they are only recorded in `hits`, so aborting and writing the
    results finish. The previous handlers come back on exit. Off the main thread (where signals cannot be
    handled) it does nothing."""

    def __init__(self):
        self.hits: list[int] = []
        self.deferring = False
        self._old: dict = {}

    def _handle(self, signum, _frame):
        self.hits.append(signum)
        if not self.deferring:
            self.deferring = True
            raise RunInterrupted(signum)

    def defer(self) -> None:
        self.deferring = True

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
