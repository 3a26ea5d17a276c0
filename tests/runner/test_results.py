"""The sweep table: concurrent appends from several processes, new columns, no lock files left behind."""

import multiprocessing as mp

import pandas as pd

from experiments.results.files import append_sweep_row, read_sweep, sweep_row


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
