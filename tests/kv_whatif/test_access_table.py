"""kv_accesses.parquet is written as pandas writes the stream's frame: access_table (the hash lists made from
the flat hashes) equals pa.Table.from_pandas of the frame made the straightforward way, metadata included,
and the file is byte for byte what to_parquet writes; the log's columns follow a plain model of the stream."""

import io
import random

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_module

import experiments.run.runner as runner
from experiments.kv_whatif.stream import FILE, access_table
from experiments.results.atomic import atomic_write_with
from experiments.results.files import write_parquet
from testbed.core.access_log import KINDS, KVAccessLog


def reference_frame(log) -> pd.DataFrame:
    kinds, request_ids, num_tokens, hashes = log.columns()
    frame = pd.DataFrame({"kind": kinds, "request_id": request_ids, "num_tokens": num_tokens, "hashes": hashes})
    frame["num_tokens"] = frame["num_tokens"].astype("Int64")
    return frame


def random_stream(seed: int, n: int, none_share: float = 0.05) -> tuple[KVAccessLog, list[tuple]]:
    """A log fed random events, and the events it must give back (lookups where they were marked)."""
    rng = random.Random(seed)
    log, model = KVAccessLog(), []
    mark = 0
    for i in range(n):
        what = rng.random()
        if what < 0.1:
            log.mark()
            mark = len(model)
        elif what < 0.2:
            hashes = [rng.getrandbits(64) - 2**63 for _ in range(rng.randrange(0, 5))]
            num_tokens = rng.randrange(1, 500)
            log.lookup(f"r{i}", num_tokens, hashes)
            model.insert(mark, ("lookup", f"r{i}", num_tokens, hashes))
            mark += 1
        elif what < 0.5:
            hashes = [rng.getrandbits(64) - 2**63 for _ in range(rng.randrange(0, 4))]
            log.cache_all(hashes)
            model += [("cache", None, None, [h]) for h in hashes]
        else:
            hashes = [None if rng.random() < none_share else rng.getrandbits(64) - 2**63 for _ in range(3)]
            log.release_all(hashes)
            model += [("release", None, None, [] if h is None else [h]) for h in hashes]
    return log, model


@pytest.mark.parametrize("seed", range(4))
def test_columns_follow_the_stream(seed):
    log, model = random_stream(seed, 400)
    kinds, request_ids, num_tokens, hashes = log.columns()
    assert list(zip(kinds, request_ids, num_tokens, hashes)) == model


def streams():
    yield "random", random_stream(0, 3000)[0]
    yield "nones-first-and-last", random_stream(1, 500, none_share=0.5)[0]
    only_nones = KVAccessLog()
    only_nones.release_all([None, None])
    yield "no-hash-at-all", only_nones
    yield "empty", KVAccessLog()
    no_lookup = KVAccessLog()
    no_lookup.cache_all([1, 2, 3])
    yield "no-lookup", no_lookup
    only_lookups = KVAccessLog()
    only_lookups.lookup("a", 40, [5, -6])
    only_lookups.lookup("b", 3, [])
    yield "only-lookups", only_lookups
    lookup_and_nones = KVAccessLog()
    lookup_and_nones.lookup("a", 40, [2**62])
    lookup_and_nones.release_all([None, None])
    yield "lookup-and-releases-of-nothing", lookup_and_nones


@pytest.mark.parametrize("none_share", [0.02, 0.3])  # releases of no prefix: few (found one by one), many
@pytest.mark.parametrize("seed", range(3))
def test_arrays_are_the_columns(seed, none_share):
    log = random_stream(seed, 2000, none_share=none_share)[0]
    kinds, request_ids, num_tokens, hashes = log.columns()
    codes, lookup_at, lookup_ids, lookup_tokens, values, counts = log.arrays()
    assert [KINDS[c] for c in codes] == kinds
    assert [request_ids[i] for i in lookup_at] == lookup_ids and [num_tokens[i] for i in lookup_at] == lookup_tokens
    assert sum(r is not None for r in request_ids) == len(lookup_at)
    assert counts.tolist() == list(map(len, hashes)) and values.tolist() == [h for row in hashes for h in row]


def test_no_arrays_for_a_hash_past_int64():
    log = KVAccessLog()
    log.lookup("a", 40, [2**63])
    log.cache_all([1, 2])
    assert log.arrays() is None and log.columns()[3] == [[2**63], [1], [2]]


@pytest.mark.parametrize("name, log", list(streams()), ids=[name for name, _ in streams()])
def test_table_and_file_as_pandas_makes_them(tmp_path, name, log):
    frame = reference_frame(log)
    table = access_table(log)
    assert table.equals(pa.Table.from_pandas(frame, preserve_index=False), check_metadata=True)
    write_parquet(tmp_path / FILE, table)
    atomic_write_with(tmp_path / "reference.parquet", lambda f: frame.to_parquet(f, index=False))
    assert (tmp_path / FILE).read_bytes() == (tmp_path / "reference.parquet").read_bytes()
    assert pd.read_parquet(io.BytesIO((tmp_path / FILE).read_bytes())).equals(
        pd.read_parquet(tmp_path / "reference.parquet")
    )
    assert pq.read_schema(tmp_path / FILE).metadata[b"pandas"]


def test_a_run_writes_what_pandas_writes(tmp_path, monkeypatch):
    """A simulated replay's kv_accesses.parquet is the file to_parquet writes of the stream's frame."""
    logs = []
    real = runner.access_table

    def keep(log):
        logs.append(log)
        return real(log)

    monkeypatch.setattr(runner, "access_table", keep)
    overrides = ["executor=sim", "device=h100-sxm", "model=llama-3.1-8b", "progress=false", "wandb.enabled=false"]
    overrides += ["trace=azure", "trace.max_requests=80", "replay=open_loop"]
    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        runner.run_trace(compose("config", overrides=overrides), tmp_path / "run")
    (log,) = logs
    assert len(log.columns()[0]) > 1000
    reference = io.BytesIO()
    reference_frame(log).to_parquet(reference, index=False)
    assert (tmp_path / "run" / FILE).read_bytes() == reference.getvalue()
