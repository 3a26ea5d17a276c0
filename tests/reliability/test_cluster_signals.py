"""The cluster runner keeps a run whole when a stop signal lands while its results are written, as the
single-engine runner does: every file complete, summary.json says interrupted and names the signal, the
sweep row too, and RunInterrupted ends the run. A real SIGTERM sent to this process (simulated cluster)."""

import json
import os
import signal

import pandas as pd
import pytest

from experiments.cluster.runner import run_cluster
from experiments.results.files import read_sweep
from experiments.run import replay_run
from experiments.run.stop_signals import RunInterrupted

from ..cluster.helpers import SIM, SMALL_TRACE, cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_sigterm_while_the_cluster_run_is_written(tmp_path, monkeypatch):
    write_run = replay_run.write_run

    def signalled_write(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # lands while the files are written: deferred
        write_run(*args, **kwargs)

    monkeypatch.setattr(replay_run, "write_run", signalled_write)
    out = tmp_path / "run"
    overrides = [*SIM, *SMALL_TRACE, "replay=open_loop", "cluster.replicas=2", f"results.sweep_table={tmp_path}/s.csv"]
    with pytest.raises(RunInterrupted) as stopped:
        run_cluster(cfg(*overrides), out, quiet=True)
    assert stopped.value.signum == signal.SIGTERM
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == "SIGTERM"
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 40 and summary["completed"] == 40  # the replay had finished: nothing lost
    assert summary["cluster_replicas"] == 2 and sum(summary["replica_requests"]) == 40
    row = read_sweep(tmp_path / "s.csv", include_incomplete=True)
    assert len(row) == 1 and bool(row["interrupted"][0]) and row["signal"][0] == "SIGTERM"
    assert read_sweep(tmp_path / "s.csv").empty  # left out of the figures like any interrupted run
