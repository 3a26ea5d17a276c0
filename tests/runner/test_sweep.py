"""Sweeps: a 2x2 Hydra multirun leaves 4 run folders and a 4-row sweep table; the Slurm launcher's local
twin (hydra-submitit-launcher, jobs as subprocesses) does the same."""

import pandas as pd

from .helpers import read_run, run_cli, run_here

SMALL = [
    "model=tiny",
    "cache.num_blocks=512",
    "trace=synthetic",
    "trace.num_requests=6",
    "trace.rate=50",
    "trace.prompt_len={dist:fixed,value:24}",
    "trace.output_len={dist:fixed,value:3}",
    "replay=open_loop",
]


def check_sweep(sweep_dir, n, columns):
    runs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and (p / "summary.json").exists())
    assert [p.name for p in runs] == [str(i) for i in range(n)]
    table = pd.read_csv(sweep_dir / "sweep.csv")
    assert len(table) == n
    assert sorted(table["run_dir"].astype(str)) == [str(i) for i in range(n)]
    for run in runs:
        summary, requests, steps = read_run(run)
        assert summary["completed"] == 6 and len(requests) == 6 and len(steps) > 0
        assert (run / "config.yaml").exists()
    return table[columns].drop_duplicates()


def test_two_by_two_multirun(tmp_path):
    # Hydra's basic launcher runs the jobs inside run.py's own process, so run.py runs here (the launchers
    # with processes of their own are the tests below)
    log = tmp_path / "multirun.log"
    args = ("-m", *SMALL, "cache.block_size=8,16", "scheduler.max_num_seqs=2,8", f"hydra.sweep.dir={tmp_path}")
    assert run_here(*args, "progress=false", log=log) == 0, log.read_text()[-3000:]
    grid = check_sweep(tmp_path, 4, ["cache.block_size", "scheduler.max_num_seqs"])
    assert sorted(map(tuple, grid.to_numpy().tolist())) == [(8, 2), (8, 8), (16, 2), (16, 8)]


def test_slurm_launcher_local_twin(tmp_path):
    run_cli("-m", "hydra/launcher=slurm_local", *SMALL, "cache.block_size=8,16", f"hydra.sweep.dir={tmp_path}")
    grid = check_sweep(tmp_path, 2, ["cache.block_size"])
    assert sorted(grid["cache.block_size"]) == [8, 16]
    assert (tmp_path / ".submitit").is_dir()


def test_parallel_launcher_runs_simulated_points(tmp_path):
    """hydra/launcher=parallel (hydra-joblib-launcher): a 2-point simulator sweep runs its points in joblib
    worker processes and leaves the same run folders and sweep table as the sequential launcher."""
    sim = ["executor=sim", "device=h100-sxm"]
    proc = run_cli(
        "-m",
        "hydra/launcher=parallel",
        "hydra.launcher.n_jobs=2",
        *SMALL,
        *sim,
        "cache.block_size=8,16",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    grid = check_sweep(tmp_path, 2, ["cache.block_size"])
    assert sorted(grid["cache.block_size"]) == [8, 16]
