"""The sweep table: concurrent appends from several processes, new columns, no lock files left behind."""

import multiprocessing as mp

import pandas as pd

from experiments.kv_whatif.stream import FILE as ACCESS_FILE
from experiments.results.files import OPTIONAL_FILES, append_sweep_row, load_run, read_sweep, sweep_row, write_run


def _append_many(args):
    table, worker = args
    for i in range(20):
        append_sweep_row(table, {"run_dir": f"{worker}-{i}", "worker": worker, "value": i * 0.5})


def test_concurrent_appends_keep_every_row(tmp_path):
    table = tmp_path / "sweep.csv"
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_append_many, [(table, w) for w in range(4)])
    df = read_sweep(tmp_path)
    assert len(df) == 80 and df["run_dir"].nunique() == 80
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv"]


def test_new_columns_are_merged(tmp_path):
    table = tmp_path / "sweep.csv"
    append_sweep_row(table, {"run_dir": "a", "x": 1})
    append_sweep_row(table, {"run_dir": "b", "y": 2.5, "x": 3})
    append_sweep_row(table, {"run_dir": "c"})
    df = pd.read_csv(table)
    assert df["run_dir"].tolist() == ["a", "b", "c"]
    assert df["x"].tolist()[:2] == [1, 3] and pd.isna(df.loc[0, "y"]) and df.loc[1, "y"] == 2.5


def test_sweep_row_keeps_scalars():
    row = sweep_row(
        {"completed": 3, "slo": {"ttft_ms": 1}, "percentiles": [50], "error": None, "x": float("nan")}, {"run_dir": "0"}
    )
    assert row == {"run_dir": "0", "completed": 3, "error": None, "x": row["x"]}


def test_a_table_whose_writer_died_before_its_first_row_reads_empty_and_takes_rows(tmp_path):
    table = tmp_path / "sweep.csv"
    table.touch()  # what append_sweep_row's open leaves when its process is killed right after
    assert read_sweep(table, include_incomplete=True).empty and read_sweep(tmp_path).empty
    append_sweep_row(table, {"run_dir": "a", "x": 1})
    assert read_sweep(table).to_dict("records") == [{"run_dir": "a", "x": 1}]


def test_a_rewritten_folder_keeps_no_earlier_optional_file(tmp_path):
    """A run written into a folder an earlier run used loses the earlier run's files it does not write itself
    (its access stream, clock, turns, trace report), and keeps those it writes."""
    assert ACCESS_FILE in OPTIONAL_FILES and "turns.parquet" in OPTIONAL_FILES
    requests = pd.DataFrame({"request_id": ["a"], "token_times": [[0.5]]})
    steps = pd.DataFrame({"step": [1], "scheduled_ids": [["a"]]})
    table = pd.DataFrame({"x": [1]})
    tables = {ACCESS_FILE: table, "turns.parquet": table}
    common = dict(config_yaml="x: 1\n", requests=requests, steps=steps)
    write_run(tmp_path, **common, summary={"run": 1}, trace_report={"rows": 1}, clock=table, tables=tables)
    assert all((tmp_path / name).is_file() for name in OPTIONAL_FILES)
    write_run(tmp_path, **common, summary={"run": 2}, tables={"turns.parquet": table})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.yaml", "requests.parquet", "steps.parquet", "summary.json", "turns.parquet"
    ]  # fmt: skip
    assert load_run(tmp_path)[0] == {"run": 2}
