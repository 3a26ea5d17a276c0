"""A run's result tables take arrow's memory from malloc (experiments.results.arrow_pool) and the default pool
comes back after, also when writing fails; what is written reads back the same."""

import pandas as pd
import pyarrow as pa
import pytest

import experiments.results.files as files
from experiments.results.arrow_pool import system_memory_pool
from experiments.results.files import load_run, write_run


def test_the_block_allocates_from_malloc_and_restores_the_default():
    before = pa.default_memory_pool()
    system = pa.system_memory_pool()
    with system_memory_pool():
        assert pa.default_memory_pool().backend_name == system.backend_name == "system"
        held = system.bytes_allocated()
        array = pa.array(range(100_000))
        assert system.bytes_allocated() >= held + 8 * 100_000
    assert pa.default_memory_pool().backend_name == before.backend_name
    assert array.sum().as_py() == sum(range(100_000))  # made inside, used and freed after
    with pytest.raises(RuntimeError), system_memory_pool():
        raise RuntimeError("a failed write")
    assert pa.default_memory_pool().backend_name == before.backend_name


def test_write_run_converts_in_malloc_and_reads_back(tmp_path, monkeypatch):
    pools = []
    real = files.write_parquet

    def noting(path, frame):
        pools.append(pa.default_memory_pool().backend_name)
        real(path, frame)

    monkeypatch.setattr(files, "write_parquet", noting)
    default = pa.default_memory_pool().backend_name
    requests = pd.DataFrame({"request_id": ["a", "b"], "token_times": [[0.5, 1.0], []]})
    steps = pd.DataFrame({"step": [1, 2], "scheduled_ids": [["a", "b"], ["a"]]})
    write_run(tmp_path, config_yaml="x: 1\n", requests=requests, steps=steps, summary={"completed": 2})
    assert pools == ["system", "system"]
    assert pa.default_memory_pool().backend_name == default
    summary, read_requests, read_steps = load_run(tmp_path)
    assert summary == {"completed": 2}
    assert read_requests["token_times"].map(list).tolist() == [[0.5, 1.0], []]
    assert read_steps["scheduled_ids"].map(list).tolist() == [["a", "b"], ["a"]]
