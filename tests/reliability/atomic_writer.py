"""A result writer to be killed: `python -m tests.reliability.atomic_writer FOLDER RUN_ID` rewrites one run
folder (experiments.results.files.write_run) and appends sweep rows, some bringing new columns (so the table is
rewritten), as fast as it can until killed. Every file says which write it came from (run id, version), so
a reader can tell a complete file of some write from a torn one."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.results.files import append_sweep_row, write_run

BASE_ROWS = 50_000  # big enough that a parquet write takes a while to kill in the middle of


def frame(run: int, version: int) -> pd.DataFrame:
    n = BASE_ROWS + version
    return pd.DataFrame({"run": np.full(n, run), "version": np.full(n, version), "x": np.arange(n, dtype=float)})


def main(folder: Path, run: int) -> None:
    run_dir = folder / "run"
    print("ready", flush=True)
    version = 0
    while True:
        summary = {"run": run, "version": version, "rows": BASE_ROWS + version}
        write_run(
            run_dir,
            config_yaml=f"run: {run}\nversion: {version}\n",
            requests=frame(run, version),
            steps=frame(run, version),
            summary=summary,
            trace_report=summary,
        )
        row = {"run_dir": f"{run}-{version}", "run": run, "version": version, "payload": "x" * 200}
        if version % 5 == 4:
            row[f"new_column_{run}_{version}"] = version  # forces a rewrite of the whole table
        append_sweep_row(folder / "sweep.csv", row)
        version += 1


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
