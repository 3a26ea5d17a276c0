"""Metric definitions on hand-made tables (no engine): vLLM's formulas, goodput, SLO errors, KV stats."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.results.metrics import SLOError, check_slo, chunk_gaps, step_summary, summarize
from experiments.results.step_rows import kv_fields


def table(rows):
    base = {"first_scheduled_time": 0.0, "cached_tokens": 0, "num_preemptions": 0, "finish_reason": "length"}
    return pd.DataFrame([{**base, **r} for r in rows])


REQS = table(
    [
        # arrival 0, first token at 1, tokens at 1, 2, 4 -> TTFT 1000, E2EL 4000, TPOT 1500, ITL 1000, 2000
        {
            "arrival_time": 0.0,
            "first_token_time": 1.0,
            "finish_time": 4.0,
            "prompt_tokens": 10,
            "output_tokens": 3,
            "token_times": [1.0, 2.0, 4.0],
            "cached_tokens": 5,
        },
        # one output token: no TPOT, no ITL
        {
            "arrival_time": 1.0,
            "first_token_time": 1.5,
            "finish_time": 1.5,
            "prompt_tokens": 20,
            "output_tokens": 1,
            "token_times": [1.5],
        },
        # two tokens in one step (speculative): one chunk, so ITL gets 3-2=1 only
        {
            "arrival_time": 2.0,
            "first_token_time": 2.0,
            "finish_time": 3.0,
            "prompt_tokens": 30,
            "output_tokens": 3,
            "token_times": [2.0, 2.0, 3.0],
            "num_preemptions": 2,
        },
        # aborted: counted as failed, not timed
        {
            "arrival_time": 3.0,
            "first_token_time": None,
            "finish_time": 3.5,
            "prompt_tokens": 40,
            "output_tokens": 0,
            "token_times": [],
            "finish_reason": "abort",
        },
    ]
)


def test_vllm_definitions():
    s = summarize(REQS, pd.DataFrame(), start_time=0.0, end_time=5.0)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_input_tokens"] == 60 and s["total_output_tokens"] == 7
    assert s["duration"] == 5.0
    assert s["request_throughput"] == pytest.approx(3 / 5)
    assert s["output_throughput"] == pytest.approx(7 / 5)
    assert s["total_token_throughput"] == pytest.approx(67 / 5)
    assert s["mean_ttft_ms"] == pytest.approx((1000 + 500 + 0) / 3)
    assert s["median_ttft_ms"] == pytest.approx(500)
    assert s["mean_tpot_ms"] == pytest.approx((1500 + 500) / 2)  # (E2EL - TTFT) / (n - 1)
    assert s["mean_itl_ms"] == pytest.approx((1000 + 2000 + 1000) / 3)
    assert s["p99_itl_ms"] == pytest.approx(np.percentile([1000, 2000, 1000], 99))
    assert s["mean_e2el_ms"] == pytest.approx((4000 + 500 + 1000) / 3)
    assert s["p90_e2el_ms"] == pytest.approx(np.percentile([4000, 500, 1000], 90))
    assert s["prefix_hit_rate"] == pytest.approx(5 / 100)
    assert s["num_preemptions"] == 2
    assert s["request_goodput"] is None  # no SLO set


def test_goodput():
    s = summarize(REQS, pd.DataFrame(), 0.0, 5.0, slo={"ttft_ms": 600, "tpot_ms": None, "e2el_ms": 2000})
    # request 1 fails TTFT and E2EL; 2 and 3 pass (request 2 has no TPOT, so no TPOT constraint)
    assert s["request_goodput"] == pytest.approx(2 / 5)
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    s = summarize(REQS, pd.DataFrame(), 0.0, 5.0, slo={"tpot_ms": 1000})
    assert s["request_goodput"] == pytest.approx(2 / 5)


@pytest.mark.parametrize(
    "slo, match",
    [
        ({"ttft": 100}, "slo.ttft: unknown SLO key"),
        ({"ttft_ms": -1}, "slo.ttft_ms: must be a positive"),
        ({"e2el_ms": "fast"}, "slo.e2el_ms"),
    ],
)
def test_bad_slo(slo, match):
    with pytest.raises(SLOError, match=match):
        check_slo(slo)


def test_percentile_keys_and_empty():
    s = summarize(REQS.iloc[3:], pd.DataFrame(), 0.0, 1.0, percentiles=[50, 99.9])
    assert s["completed"] == 0 and s["mean_ttft_ms"] == 0.0
    assert "p99.9_ttft_ms" in s and "p50_itl_ms" in s


def test_chunk_gaps():
    assert chunk_gaps([1.0, 1.0, 2.5, 2.5, 3.0]).tolist() == [1.5, 0.5]
    assert chunk_gaps([]).size == 0


@dataclass
class OldStats:  # KVCacheStats before the allocator breakdown
    num_blocks: int = 10
    block_size: int = 4
    used_blocks: int = 5
    used_token_slots: int = 15
    slack_token_slots: int = 5
    cached_free_blocks: int = 1
    free_blocks: int = 5


@dataclass
class NewStats(OldStats):  # with the breakdown (token, reserved, internal, external, free sum to 40)
    token_slots: int = 15
    reserved_slots: int = 3
    internal_slots: int = 2
    external_slots: int = 8
    free_slots: int = 12


def test_kv_fields_before_and_after_breakdown():
    old = kv_fields(OldStats())
    assert old["kv_usage"] == 0.5
    assert old["frag_internal"] == 5 / 40 and old["frag_reserved"] == 0 and old["frag_external"] == 0
    new = kv_fields(NewStats())
    assert (new["frag_internal"], new["frag_reserved"], new["frag_external"]) == (2 / 40, 3 / 40, 8 / 40)
    assert new["kv_reserved_slots"] == 3 and new["kv_used_blocks"] == 5


def test_step_summary_is_time_weighted():
    steps = pd.DataFrame(
        {
            "duration_s": [1.0, 3.0],
            "kv_usage": [0.2, 0.6],
            "frag_internal": [0.1, 0.0],
            "frag_reserved": [0.0, 0.0],
            "frag_external": [0.0, 0.0],
            "num_seqs": [2, 4],
            "num_prefill_tokens": [10, 0],
            "num_decode_tokens": [0, 4],
            "num_running": [2, 4],
            "num_waiting": [1, 0],
        }
    )
    s = step_summary(steps)
    assert s["kv_utilization_mean"] == pytest.approx((0.2 * 1 + 0.6 * 3) / 4)
    assert s["frag_internal"] == pytest.approx(0.1 / 4)
    assert s["kv_utilization_max"] == 0.6 and s["mean_batch_size"] == 3


@given(st.lists(st.lists(st.floats(0, 1e4, allow_nan=False), max_size=12), min_size=1, max_size=8))
def test_itl_statistics_are_those_of_every_gap_in_order(token_times):
    """The ITL statistics: mean / median / std / percentiles of every request's chunk gaps, request after
    request, to the last bit (gaps of repeated times dropped; a request of one token or none adds none)."""
    rows = [
        {"arrival_time": 0.0, "first_token_time": 0.0, "finish_time": 1e4, "prompt_tokens": 1}
        | {"output_tokens": len(times), "token_times": sorted(times)}
        for times in token_times
    ]
    s = summarize(table(rows), pd.DataFrame(), start_time=0.0, end_time=1e4)
    gaps = [1e3 * g for row in rows for g in np.diff(row["token_times"]).tolist() if g > 0] or [0.0]
    assert s["mean_itl_ms"] == float(np.mean(gaps)) and s["std_itl_ms"] == float(np.std(gaps))
    assert s["median_itl_ms"] == float(np.median(gaps))
    assert s["p99_itl_ms"] == float(np.percentile(gaps, 99))
