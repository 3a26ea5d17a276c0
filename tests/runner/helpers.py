"""Helpers shared by the runner tests (a uniquely named module, so it never clashes with another conftest)."""

import contextlib
import itertools
import json
import logging
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*overrides, cwd=ROOT, env=None, timeout=900, check=True) -> subprocess.CompletedProcess:
    """`python run.py overrides...` in a subprocess (progress bar off, W&B off unless env says)."""
    full_env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *overrides, "progress=false"],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"run.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def run_here(*args: str, log: Path, err: Path | None = None) -> int:
    """`python run.py ARGS` as __main__ in this process, for tests that are not about the process (a run.py
    start-up costs seconds of imports and composes): run.py's own entry point and Hydra command line, its
    output into `log` (its stderr into `err` if given), Hydra's logging handlers removed afterwards. Returns
    the exit code."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(open(log, "w"))
        stack.enter_context(contextlib.redirect_stdout(f))
        stack.enter_context(contextlib.redirect_stderr(f if err is None else stack.enter_context(open(err, "w"))))
        argv, sys.argv = sys.argv, [str(ROOT / "run.py"), *args]
        try:
            runpy.run_path(str(ROOT / "run.py"), run_name="__main__")
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else int(e.code is not None)
        finally:
            sys.argv = argv
            for h in root.handlers[:]:  # Hydra's job logging (console and run.log): this run's only
                if h not in handlers:
                    root.removeHandler(h)
                    h.close()
            root.handlers[:0] = [h for h in handlers if h not in root.handlers]
            root.setLevel(level)
    return rc


def recompute(requests: pd.DataFrame, start_time: float, end_time: float, slo: dict | None = None) -> dict:
    """vllm bench serve's metrics straight from a requests table, written independently of
    experiments.results.metrics (plain numpy, per-request loops)."""
    done = requests[requests["finish_reason"].isin(["length", "stop"])]
    ttft, e2el, tpot, itl, good = [], [], [], [], 0
    for r in done.itertuples():
        t = 1e3 * (r.first_token_time - r.arrival_time)
        e = 1e3 * (r.finish_time - r.arrival_time)
        ttft.append(t)
        e2el.append(e)
        p = (e - t) / (r.output_tokens - 1) if r.output_tokens > 1 else None
        if p is not None:
            tpot.append(p)
        times = sorted(set(r.token_times))  # one chunk per step
        itl += [1e3 * (b - a) for a, b in itertools.pairwise(times)]
        ok = True
        for key, value in (slo or {}).items():
            v = {"ttft_ms": t, "e2el_ms": e, "tpot_ms": p}[key]
            ok &= v is None or v <= value
        good += ok
    dur = end_time - start_time
    out = {
        "completed": len(done),
        "total_input_tokens": int(done["prompt_tokens"].sum()),
        "total_output_tokens": int(done["output_tokens"].sum()),
        "duration": dur,
        "request_throughput": len(done) / dur,
        "output_throughput": done["output_tokens"].sum() / dur,
        "total_token_throughput": (done["prompt_tokens"].sum() + done["output_tokens"].sum()) / dur,
        "prefix_hit_rate": requests["cached_tokens"].sum() / requests["prompt_tokens"].sum(),
        "num_preemptions": int(requests["num_preemptions"].sum()),
    }
    if slo:
        out["request_goodput"] = good / dur
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        v = np.array(values or [0.0])
        out[f"mean_{name}_ms"] = v.mean()
        out[f"median_{name}_ms"] = np.median(v)
        out[f"p90_{name}_ms"] = np.percentile(v, 90)
        out[f"p99_{name}_ms"] = np.percentile(v, 99)
    return out


def assert_summary_matches(summary: dict, requests: pd.DataFrame, rel=1e-9):
    expect = recompute(requests, summary["start_time"], summary["end_time"], summary.get("slo"))
    for key, value in expect.items():
        assert summary[key] == pytest.approx(value, rel=rel, abs=1e-9), key


def read_run(run_dir):
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, pd.read_parquet(run_dir / "requests.parquet"), pd.read_parquet(run_dir / "steps.parquet")
