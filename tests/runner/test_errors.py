"""Bad input gives a clear error naming the file, line and field (in-process, model=tiny)."""

import pytest

from experiments.results.metrics import SLOError
from experiments.run.runner import build_engine, run_trace
from experiments.traces import TraceError

from .helpers import read_run

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,10,5\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "file not found"),
        ("", "empty file"),
        (HEADER, "no data rows"),
        (HEADER + ROW + "2023-11-16 18:15:47.0,-3,5\n", "line 3: field 'ContextTokens': negative value"),
        (HEADER + ROW + "2023-11-16 18:15:47.0,ten,5\n", "line 3: field 'ContextTokens': not a finite number"),
        ("TIMESTAMP,Context,GeneratedTokens\n" + ROW, "field 'ContextTokens': missing column"),
        (HEADER + "yesterday,10,5\n", "line 2: field 'TIMESTAMP': not a timestamp"),
    ],
)
def test_bad_trace_file(tmp_path, tiny_cfg, text, message):
    path = tmp_path / "trace.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TraceError, match=message) as e:
        run_trace(tiny_cfg("trace=azure", f"trace.path={path}"), tmp_path / "run")
    assert str(path) in str(e.value)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_bad_jsonl_line(tmp_path, tiny_cfg):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 1,\n')
    with pytest.raises(TraceError, match=r"t.jsonl: line 2: malformed JSON"):
        run_trace(tiny_cfg("trace=mooncake", f"trace.path={path}"), tmp_path / "run")


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["+slo.ttft=100"], SLOError, "slo.ttft: unknown SLO key"),
        (["slo.tpot_ms=-5"], SLOError, "slo.tpot_ms: must be a positive"),
        (["+trace.colour=red"], TraceError, r"unknown trace option\(s\) \['colour'\]"),
        (["replay=closed_loop", "replay.concurrency=0"], ValueError, "replay.concurrency"),
        (["replay.max_prompt_tokens=-1"], ValueError, "replay.max_prompt_tokens"),
        (["trace.max_requests=0"], TraceError, "max_requests"),
    ],
)
def test_bad_config(tmp_path, tiny_cfg, overrides, error, message):
    with pytest.raises(error, match=message):
        run_trace(tiny_cfg("trace=azure", *overrides), tmp_path / "run")


def test_request_too_big_for_the_cache_names_the_line(tmp_path, tiny_cfg):
    cfg = tiny_cfg("trace=azure", "cache.num_blocks=8", "trace.max_requests=5")  # 8 blocks = 128 tokens
    with pytest.raises(
        TraceError,
        match=r"azure_llm_2023_conv_sample.csv: line 2: field 'length': "
        r"cannot run on this engine: request azure-0: .* the whole cache has 8",
    ):
        run_trace(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # rejected before anything ran


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_or_crash_mid_run_keeps_measurements(tmp_path, tiny_cfg, exc):
    cfg = tiny_cfg(
        "trace=synthetic",
        "trace.num_requests=20",
        "trace.rate=null",
        "trace.prompt_len={dist:fixed,value:16}",
        "trace.output_len={dist:fixed,value:10}",
        "scheduler.max_num_seqs=4",
    )
    engine = build_engine(cfg)

    def boom(stats):
        if stats.step == 12:
            raise exc("stop here")

    engine.step_callbacks.append(boom)
    with pytest.raises(exc):
        run_trace(cfg, tmp_path / "run", engine)
    summary, requests, steps = read_run(tmp_path / "run")
    assert summary["interrupted"] is (exc is KeyboardInterrupt)
    assert (summary["error"] is None) is (exc is KeyboardInterrupt)
    assert 0 < summary["completed"] < 20 and len(steps) == 11
    assert set(requests["finish_reason"]) == {"length", "abort"}
    assert not engine.has_unfinished()  # in-flight requests were aborted
