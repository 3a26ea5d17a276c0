"""Microbenchmark: the engine's host-side cost per decode step (host executor: no model runs).

Run on purpose (not under testpaths): `python -m pytest benchmarks/test_bench_host.py --benchmark-only`.
One step = schedule + KV-cache bookkeeping + input preparation + output handling for N running requests,
each decoding one token. The phase breakdown and the committed table come from
`python -m benchmarks.host` (results/host_overhead/).
"""

import pytest

from benchmarks.host import make_steady_engine


@pytest.mark.parametrize("running", [64, 256, 1024])
def test_host_step(benchmark, running):
    engine = make_steady_engine(running)
    benchmark.extra_info["running"] = running
    benchmark.pedantic(engine.step, rounds=100 if running < 1024 else 40, iterations=1, warmup_rounds=3)
    assert engine.scheduler.num_running == running
    assert engine.last_stats.num_decode_tokens == running


@pytest.mark.parametrize("running", [256])
def test_input_preparation(benchmark, running):
    """prepare_inputs alone (the executor's host half): block tables, staging, numpy."""
    from testbed.executor.inputs import prepare_inputs

    engine = make_steady_engine(running)
    out = engine.scheduler.schedule()
    executor = engine.executor
    executor.tables.apply(out.finished_ids, out.block_updates)
    benchmark.pedantic(
        lambda: prepare_inputs(out, executor.tables, executor.input_buffers),
        rounds=200,
        iterations=1,
        warmup_rounds=3,
    )
