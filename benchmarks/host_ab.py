"""A-B-A comparison of the host cost per decode step: this checkout against a git revision, interleaved.

    python -m benchmarks.host --ab main --rounds 5        # A B A B ... A, each run a fresh process

The revision is exported (`git archive`) to a temporary folder; each run is `python -m benchmarks.host
--no-gc-freeze-rows --out TMP` in one tree or the other (so each imports its own testbed), alternating
A (this checkout) and B (the revision), starting and ending with A. For every batch size the ratio of
each B run to the mean of the A runs on either side is one draw (drift between neighbours cancels);
the report gives the median step time of each side, the mean ratio B/A and its 95% t-interval over the
rounds (experiments.statistics.intervals.t_interval), and the machine's load before and after.
"""

import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from benchmarks.common import environment, load_average, markdown_table
from experiments.statistics.intervals import t_interval

ROOT = Path(__file__).resolve().parents[1]


def export(revision: str, folder: Path) -> str:
    """Write the revision's tree into folder; returns its commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", revision], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return commit


def one_run(tree: Path, running: list[int], steps: int, out: Path) -> dict[int, dict]:
    """benchmarks.host in `tree`, in its own process: {running: result row}."""
    cmd = [sys.executable, "-m", "benchmarks.host", "--no-gc-freeze-rows", "--steps", str(steps), "--out", str(out)]
    subprocess.run([*cmd, "--running", *map(str, running)], cwd=tree, check=True, capture_output=True, text=True)
    rows = json.loads((out / "host_overhead.json").read_text())["results"]
    return {r["running"]: r for r in rows if not r["gc_freeze"]}


def ab(revision: str, rounds: int, running: list[int], steps: int) -> tuple[str, dict]:
    """Run the interleaved comparison; (markdown report, raw data)."""
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        commit = export(revision, base)
        a_runs, b_runs = [], []
        for r in range(rounds + 1):
            a_runs.append(one_run(ROOT, running, steps, Path(tmp) / f"a{r}"))
            print(f"round {r}: A " + ", ".join(f"{n}: {a_runs[-1][n]['median_us']:.0f} us" for n in running))
            if r < rounds:
                b_runs.append(one_run(base, running, steps, Path(tmp) / f"b{r}"))
                print(f"round {r}: B " + ", ".join(f"{n}: {b_runs[-1][n]['median_us']:.0f} us" for n in running))
    rows, data = [], {}
    for n in running:
        a = [run[n]["median_us"] for run in a_runs]
        b = [run[n]["median_us"] for run in b_runs]
        ratios = [b[i] / ((a[i] + a[i + 1]) / 2) for i in range(rounds)]
        low, high = t_interval(ratios)
        data[n] = {"a_us": a, "b_us": b, "b_over_a": ratios}
        rows.append(
            [
                n,
                statistics.median(a),
                statistics.median(b),
                f"{statistics.fmean(ratios):.2f}x",
                f"{low:.2f}-{high:.2f}x",
                " ".join(f"{x:.2f}" for x in ratios),
            ]
        )
    env = environment()
    table = markdown_table(
        ["running", "A: this tree, median us", f"B: {commit}, median us", "B / A", "95% CI", "per round"], rows
    )
    text = (
        f"## A-B-A: this tree (A) vs {revision} = {commit} (B)\n\n{rounds} rounds, A B A ... A, each a fresh "
        f"process of `benchmarks.host` ({steps} steps); B / A: each B run over the mean of its neighbouring A "
        f"runs (> 1: A is faster).\n\n{table}\n\n- machine: {env['cpu']}, {env['cpu_count']} cores; git "
        f"{env['git']}; {env['date']}\n- load average before: {load_before}; after: {load_average()}\n"
    )
    return text, {"revision": revision, "commit": commit, "rounds": rounds, "steps": steps, "runs": data, "env": env}
