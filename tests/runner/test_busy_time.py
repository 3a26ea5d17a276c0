"""KV utilisation and fragmentation means are over the engine's busy time (step durations), and the summary
says how much of the run that is (busy_fraction), so idle gaps are neither hidden nor silently mixed in."""

import pandas as pd
import pytest

from experiments.results.metrics import step_summary, summarize
from experiments.results.recorder import requests_frame


def test_kv_means_are_busy_time_weighted_and_busy_fraction_reports_the_rest():
    steps = pd.DataFrame(
        {
            "step": [1, 2, 3],
            "start_time": [0.0, 0.1, 5.0],  # an idle gap of ~4.7 s before the last step
            "duration_s": [0.1, 0.2, 0.2],
            "num_seqs": [1, 1, 1],
            "num_prefill_tokens": [4, 0, 0],
            "num_decode_tokens": [0, 1, 1],
            "num_running": [1, 1, 1],
            "num_waiting": [0, 0, 0],
            "kv_usage": [0.5, 1.0, 0.0],
            "frag_internal": [0.0, 0.1, 0.0],
            "frag_reserved": [0.2, 0.1, 0.0],
            "frag_external": [0.0, 0.0, 0.0],
        }
    )
    s = step_summary(steps)
    assert s["kv_utilization_mean"] == pytest.approx((0.1 * 0.5 + 0.2 * 1.0) / 0.5)  # idle gap not counted
    assert s["frag_reserved"] == pytest.approx((0.1 * 0.2 + 0.2 * 0.1) / 0.5)
    requests = requests_frame(
        [
            {
                "request_id": "a",
                "arrival_time": 0.0,
                "first_scheduled_time": 0.0,
                "first_token_time": 0.1,
                "finish_time": 5.2,
                "prompt_tokens": 4,
                "output_tokens": 3,
                "target_output_tokens": 3,
                "cached_tokens": 0,
                "num_preemptions": 0,
                "finish_reason": "length",
                "token_times": [0.1, 0.3, 5.2],
            }
        ]
    )
    summary = summarize(requests, steps, 0.0, 5.2)
    assert summary["busy_s"] == pytest.approx(0.5)
    assert summary["busy_fraction"] == pytest.approx(0.5 / 5.2)
