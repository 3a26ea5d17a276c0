"""llama.cpp as a benchmark system: what happens without a toolchain, the fixed-shape preset end to end on the
tiny model (llama.cpp skipped with its reason), and (slow, on purpose) the real build, batched-bench and server."""

import json
import shutil

import pytest

from benchmarks import llamacpp, throughput


def test_missing_toolchain_is_a_clear_skip(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))  # no cached build to fall back on
    monkeypatch.setattr(llamacpp.shutil, "which", lambda name: None if name == "cmake" else "/usr/bin/" + name)
    with pytest.raises(llamacpp.LlamaCppUnavailable, match="needs cmake"):
        llamacpp.ensure_build()
    assert not (tmp_path / "llamacpp").exists() or not any((tmp_path / "llamacpp").rglob("*.tar.gz"))


def test_shape_only_model_is_refused_before_any_build():
    with pytest.raises(llamacpp.LlamaCppUnavailable, match="no weights folder"):
        llamacpp.model_weights("tiny")


def test_http_replay_reads_llama_server_model_card(monkeypatch):
    """llama-server keeps context and vocabulary in the card's `meta`; the replay client needs them."""
    import httpx

    from experiments.replay.http_replay import server_info

    card = {"id": "m.gguf", "object": "model", "meta": {"n_ctx": 640, "n_vocab": 49152, "n_ctx_train": 8192}}

    class Response:
        def raise_for_status(self):
            pass

        def json(self):
            return {"object": "list", "data": [dict(card)]}

    monkeypatch.setattr(httpx, "get", lambda *a, **k: Response())
    info = server_info("http://127.0.0.1:1")
    assert info["max_model_len"] == 640 and info["vocab_size"] == 49152 and info["id"] == "m.gguf"


def test_shape_preset_runs_engine_and_reports_skipped_llamacpp(tmp_path, keep_torch_threads):
    """benchmarks.throughput's main in this process (each system still runs in its own)."""
    args = ["--preset", "cpu-shape", "--model", "tiny"]
    args += ["--parallel", "1", "2", "--prompt-len", "24", "--output-len", "5", "--threads", "1"]
    args += ["--kv-cache-dtype", "float16", "--out", str(tmp_path), "--name", "shape"]
    args += ["--kv-cache-memory-gb", "0.0625"]  # each engine zeroes its KV budget at start-up (default 2 GiB)
    assert throughput.main(args) == 0
    result = json.loads((tmp_path / "shape.json").read_text())
    rows = {r["system"]: r for r in result["results"]}
    assert set(rows) == {f"{s} (parallel {n})" for s in ("engine-cpu", "llamacpp") for n in (1, 2)}
    for n in (1, 2):
        engine = rows[f"engine-cpu (parallel {n})"]
        assert engine["output_tokens"] == 5 * n and engine["ttft_s"] > 0 and engine["tpot_ms"] > 0
        assert "no prefix caching" in engine["note"] and "KV cache float16" in engine["note"]
        assert rows[f"llamacpp (parallel {n})"]["error"].startswith("skipped: model 'tiny' has no weights")
    table = (tmp_path / "shape.md").read_text()
    assert "| engine-cpu | 2 |" in table and "skipped: model 'tiny'" in table


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None, reason="llama.cpp is built with cmake")
def test_real_llamacpp_batched_bench_and_server(tmp_path):
    """Builds llama.cpp (once per machine: minutes to an hour), converts SmolLM2 and runs both drivers."""
    build = llamacpp.ensure_build()
    gguf = llamacpp.ensure_gguf("smollm2-135m", build)
    rows = llamacpp.batched_bench(build, gguf, prompt_len=16, output_len=4, parallel=[1, 2], threads=1)
    assert [r["pl"] for r in rows] == [1, 2] and all(r["t"] > 0 and r["t_pp"] > 0 for r in rows)
    f32 = llamacpp.batched_bench(build, gguf, 16, 4, [1], threads=1, cache_type=llamacpp.CACHE_TYPES["float32"])
    assert f32[0]["pl"] == 1 and f32[0]["t"] > 0
    with llamacpp.LlamaServer(build, gguf, parallel=2, slot_context=64, threads=1) as server:
        run = llamacpp.replay_workload(server, [[1, 2, 3, 4], list(range(10, 30))], [3, 5])
    assert run.requests["error"].tolist() == ["", ""]
    assert sorted(run.requests["output_tokens"].tolist()) == [3, 5]
