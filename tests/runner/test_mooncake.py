"""Mooncake replay with prefix caching: the measured prefix-hit rate is the reuse the trace's hash ids imply.

The expectation is computed from the JSONL itself (not through the loader): request i can reuse the
longest prefix of its hash-id chain that an earlier request also had, token for token (a partial last
block shares its id's first tokens), counted in whole engine blocks and leaving at least one prompt token
to compute (the engine needs its logits). Run closed loop at concurrency 1 with a cache large enough to
never evict, the engine must hit exactly that, request by request.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.run.runner import build_engine, run_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "experiments" / "data" / "mooncake_fast25_synthetic_sample.jsonl"


def expected_hits(path, n, max_prompt, engine_block, trace_block=512):
    best, hits, prompts = {}, [], []  # best: chain prefix -> most tokens of its last block seen so far
    for line in path.read_text().splitlines()[:n]:
        rec = json.loads(line)
        p = min(max_prompt, rec["input_length"])
        ids = rec["hash_ids"][: -(-p // trace_block)]
        own = [min(trace_block, p - j * trace_block) for j in range(len(ids))]
        matched = 0
        for j in range(len(ids)):
            seen = best.get(tuple(ids[: j + 1]))
            if seen is None:
                break
            matched += min(own[j], seen)
            if min(own[j], seen) < trace_block:
                break
        hits.append(min(matched // engine_block, (p - 1) // engine_block) * engine_block)
        prompts.append(p)
        for j in range(len(ids)):
            key = tuple(ids[: j + 1])
            best[key] = max(best.get(key, 0), own[j])
    return hits, prompts


@pytest.mark.parametrize(
    "block_size, max_prompt",
    [
        (16, 256),  # partial trace blocks shared by id
        pytest.param(32, 700, marks=pytest.mark.slow),  # chains across a 512-token trace block
    ],
)
def test_prefix_hit_rate_matches_hash_ids(tmp_path, tiny_cfg, block_size, max_prompt):
    n = 100 if max_prompt <= 256 else 70
    cfg = tiny_cfg(
        "trace=mooncake",
        f"trace.max_requests={n}",
        "replay=closed_loop",
        "replay.concurrency=1",
        f"replay.max_prompt_tokens={max_prompt}",
        "replay.max_output_tokens=1",
        f"cache.block_size={block_size}",
        "cache.num_blocks=4096",
        "cache.prefix_caching=true",
        "scheduler.max_num_batched_tokens=1024",
    )
    engine = build_engine(cfg)
    summary = run_trace(cfg, tmp_path / "run", engine)
    hits, prompts = expected_hits(SAMPLE, n, max_prompt, block_size)
    expected_rate = sum(hits) / sum(prompts)
    assert summary["completed"] == n and summary["num_preemptions"] == 0
    assert expected_rate > 0.03  # the sample does reuse prefixes
    assert summary["prefix_hit_rate"] == pytest.approx(expected_rate, abs=1e-12)
    assert engine.kv.prefix_hit_rate == pytest.approx(expected_rate, abs=1e-12)
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert req["prompt_tokens"].tolist() == prompts
    assert req["cached_tokens"].tolist() == hits  # request by request


def test_prefix_caching_off_hits_nothing(tmp_path, tiny_cfg):
    cfg = tiny_cfg(
        "trace=mooncake",
        "trace.max_requests=70",
        "replay.max_prompt_tokens=64",
        "replay.max_output_tokens=1",
        "cache.prefix_caching=false",
    )
    summary = run_trace(cfg, tmp_path / "run")
    assert summary["completed"] == 70 and summary["prefix_hit_rate"] == 0.0
