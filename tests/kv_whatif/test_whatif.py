"""The one-pass hit-rate what-if against real simulated runs, and its invariants."""

import json

import numpy as np
import pandas as pd
import pytest

from experiments.kv_whatif import analyze, analyze_stream
from experiments.kv_whatif.__main__ import main
from experiments.kv_whatif.stack import INF, stack_distances
from experiments.kv_whatif.stream import read_accesses
from experiments.run.runner import run_trace
from testbed.core.access_log import CACHE, LOOKUP, RELEASE

from ..sessions.test_sessions import cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SESSIONS = ["trace=sessions", "replay=sessions", "trace.num_sessions=6", "trace.turns=[2,4]", "trace.think_s=0.1",
            "trace.system_tokens=48", "trace.first_tokens=[32,96]", "trace.output_tokens=[8,24]"]  # fmt: skip


def sim_run(path, num_blocks, *extra):
    overrides = ["executor=sim", "device=h100-sxm", "cache.block_size=16", f"cache.num_blocks={num_blocks}", *extra]
    return run_trace(cfg(*overrides), path)


@pytest.mark.parametrize(
    "workload, capacities",
    [
        # three sessions take turns (think time 0, one request in the engine at a time): round robin
        ([*SESSIONS, "replay.concurrency=3", "trace.think_s=0", "scheduler.max_num_seqs=1"], (24, 30, 60)),
        (
            [
                "trace=mooncake",
                "trace.block_size=16",
                "trace.max_requests=120",
                "replay=closed_loop",
                "replay.concurrency=1",
                "replay.max_prompt_tokens=320",
                "replay.max_output_tokens=8",
            ],
            (40, 80, 160),
        ),
    ],  # fmt: skip
    ids=["sessions", "mooncake"],
)
def test_stack_curve_equals_lru_runs_at_each_capacity(tmp_path, workload, capacities):
    """One request at a time, so every capacity sees the same access order: the curve from the largest run's
    stream must equal each smaller run's measured hit rate exactly."""
    sim_run(tmp_path / "big", 2000, *workload)
    result = analyze_stream(read_accesses(tmp_path / "big"), 16)
    rates = []
    for capacity in capacities:
        summary = sim_run(tmp_path / str(capacity), capacity, *workload)
        assert result.hit_rate([capacity])[0] == pytest.approx(summary["prefix_hit_rate"], abs=1e-12)
        rates.append(summary["prefix_hit_rate"])
    assert rates[0] < rates[-1]  # the capacities tested actually evict
    assert result.hit_rate([2000])[0] == pytest.approx(result.ideal_hit_rate)


def test_curve_is_monotone_and_never_above_the_ideal_with_concurrent_requests(tmp_path):
    summary = sim_run(tmp_path, 90, *SESSIONS, "replay.concurrency=6")
    out = analyze(tmp_path, plot=False)
    curve = pd.read_csv(tmp_path / "whatif_curve.csv")
    assert (np.diff(curve["lru_hit_rate"]) >= 0).all()
    assert (curve["lru_hit_rate"] <= out["ideal_hit_rate"] + 1e-12).all()
    assert summary["prefix_hit_rate"] <= out["ideal_hit_rate"] + 1e-12
    assert out["run_prefix_hit_rate"] == summary["prefix_hit_rate"]
    assert 0 < out["top10pct_blocks_reuse_share"] <= 1


def test_cli_writes_the_plot_and_json(tmp_path, capsys):
    sim_run(tmp_path, 200, *SESSIONS)
    capsys.readouterr()
    main([str(tmp_path), "--out", str(tmp_path / "w")])
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "w" / "whatif.json").read_text())
    assert (tmp_path / "w" / "whatif.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_the_stream_is_refused_with_the_key_to_set(tmp_path):
    sim_run(tmp_path, 200, *SESSIONS, "metrics.kv_access_log=false")
    assert not (tmp_path / "kv_accesses.parquet").exists()
    with pytest.raises(FileNotFoundError, match="metrics.kv_access_log=true"):
        analyze(tmp_path)


def test_stack_distances_by_hand():
    """Releases a, b, c (c most recent), a fresh unhashed block, then lookups."""
    events = [(CACHE, None, None, (h,)) for h in (1, 2, 3)]
    events += [(RELEASE, None, None, (h,)) for h in (3, 2, 1)]  # a request's blocks, tail first: 1 on top
    events += [(RELEASE, None, None, ())]  # a partial block: one more item on top
    events += [(LOOKUP, "r", 64, (1, 2, 3, 9))]  # depths 2, 3, 4, never seen
    events += [(LOOKUP, "s", 48, (2, 1))]  # prefix rule: block 1 counts block 2's depth
    res = stack_distances(events, block_size=16)
    assert res.distances.tolist() == [2, 3, 4, INF, 3, 3]
    assert res.hit_rate([1, 2, 3, 4]).tolist() == [0.0, 16 / 112, 4 * 16 / 112, 5 * 16 / 112]
    assert res.ideal_hit_rate == 5 * 16 / 112
