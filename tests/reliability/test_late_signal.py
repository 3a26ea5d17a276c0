"""A SIGTERM deferred while the results were being written still ends the run with 143, so summary.json must
say interrupted: the runner rewrites it when a signal landed after the summary was made."""

import json
import signal

from experiments.results.files import write_json
from experiments.run.replay_run import _mark_late_signal
from experiments.run.stop_signals import StopSignals


def test_summary_rewritten_when_a_signal_lands_during_the_write(tmp_path):
    summary = {"interrupted": False, "signal": None, "num_requests": 3}
    write_json(tmp_path / "summary.json", summary)
    stops = StopSignals()
    _mark_late_signal(summary, stops, tmp_path)  # no signal: nothing changes
    assert json.loads((tmp_path / "summary.json").read_text())["interrupted"] is False
    stops.hits.append(signal.SIGTERM)  # what the deferred handler records
    _mark_late_signal(summary, stops, tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["interrupted"] is True and written["signal"] == "SIGTERM" and written["num_requests"] == 3
