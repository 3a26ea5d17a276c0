"""The same short trace replayed in-process (experiments.replay.driver) and over HTTP (experiments.replay.http_replay)
gives consistent metrics: same requests, same token counts, latencies of the same size, and the
server's own /metrics agrees with what the client measured."""

import pytest

from experiments.replay.driver import Replay
from experiments.replay.http_replay import main as http_replay_main
from experiments.replay.http_replay import replay_http
from experiments.results.recorder import Recorder
from experiments.traces import load_trace
from testbed import Engine
from testbed.config import EngineConfig
from testbed.server import ServerThread

TRACE = {
    "name": "synthetic",
    "num_requests": 16,
    "rate": 16.0,
    "seed": 0,
    "prompt_len": {"dist": "uniform", "low": 16, "high": 256},
    "output_len": {"dist": "uniform", "low": 8, "high": 32},
}


def tiny_engine() -> Engine:
    return Engine(EngineConfig(model="tiny", num_blocks=2048, max_num_batched_tokens=1024))


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE, vocab_size=4096, max_model_len=131072)


def test_http_replay_matches_in_process(one_torch_thread, trace, scrape):
    engine = tiny_engine()
    recorder = Recorder().attach(engine)
    replay = Replay.of_engine(engine, recorder)
    replay.run(trace.requests, mode="open_loop")
    local_df = recorder.requests_frame()
    from experiments.results.metrics import request_summary

    local = request_summary(local_df, replay.start_time, replay.end_time)

    with ServerThread(tiny_engine()) as srv:
        run = replay_http(trace.requests, srv.url, "tiny")
        remote = run.summary()
        server_metrics = scrape(srv.url)
    remote_df = run.requests

    assert (remote_df["error"] == "").all(), remote_df["error"].tolist()
    for s in (local, remote):
        assert s["completed"] == len(trace) and s["failed"] == 0
    # exactly the same work
    assert remote["total_input_tokens"] == local["total_input_tokens"] == sum(r.prompt_len for r in trace)
    assert remote["total_output_tokens"] == local["total_output_tokens"] == sum(r.max_tokens for r in trace)
    by_id = local_df.set_index("request_id")["output_tokens"]
    for rid, n in remote_df.set_index("request_id")["output_tokens"].items():
        assert by_id[rid] == n
    # a streamed chunk per engine step, so the client sees one timestamp per token here
    assert all(len(t) == n for t, n in zip(remote_df["token_times"], remote_df["output_tokens"]))
    # same open-loop schedule: the run takes about as long (the trace spans ~1 s)
    assert remote["duration"] == pytest.approx(local["duration"], rel=0.5, abs=0.5)
    # latencies of the same size: HTTP adds transport and a second thread, not orders of magnitude
    # (2 shared cores: loose bounds; the medians are a few ms to tens of ms each)
    for key in ("median_ttft_ms", "median_itl_ms", "median_tpot_ms", "median_e2el_ms"):
        assert 0 < remote[key] < 5 * local[key] + 50, (key, local[key], remote[key])
        assert local[key] < 5 * remote[key] + 50, (key, local[key], remote[key])
    # the server's view agrees with the client's: same requests and tokens, server TTFT <= client TTFT
    assert server_metrics["vllm:time_to_first_token_seconds_count"] == len(trace)
    assert server_metrics["vllm:generation_tokens_total"] == remote["total_output_tokens"]
    assert server_metrics["vllm:prompt_tokens_total"] == remote["total_input_tokens"]
    server_mean_ttft_ms = 1e3 * (
        server_metrics["vllm:time_to_first_token_seconds_sum"]
        / server_metrics["vllm:time_to_first_token_seconds_count"]
    )
    assert server_mean_ttft_ms <= remote["mean_ttft_ms"] + 5


def test_http_replay_command_line(one_torch_thread, tmp_path, scrape):
    """`python -m experiments.replay.http_replay --url ... trace=... replay=...`: run.py's config, over HTTP."""
    with ServerThread(tiny_engine(), api_key="k") as srv:
        summary = http_replay_main(
            [
                "--url",
                srv.url,
                "--api-key",
                "k",
                "--out",
                str(tmp_path / "run"),
                "trace=synthetic",
                "trace.num_requests=6",
                "trace.rate=null",
                "trace.prompt_len={dist:fixed,value:32}",
                "trace.output_len={dist:fixed,value:4}",
                "replay=closed_loop",
                "replay.concurrency=2",
            ]
        )
        peak = scrape(srv.url)
    assert summary["completed"] == 6 and summary["total_output_tokens"] == 24 and summary["replay"] == "closed_loop"
    assert peak["vllm:request_success_total"] == 6
    for name in ("summary.json", "requests.parquet", "trace_report.json", "config.yaml"):
        assert (tmp_path / "run" / name).exists(), name
    assert (tmp_path / "sweep.csv").exists()
