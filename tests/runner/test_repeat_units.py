"""A repeated run is a unit, as a new user would try it: `python run.py ... replay.repeats=N hydra.run.dir=A`
(and B), then `python -m experiments.statistics.compare A B`; two single runs; two sweep folders with --where. On the
simulator (executor=sim, a small synthetic trace), whose repeats redraw the workload by default.

The planted difference: a machine 10% slower, i.e. this CPU's committed step-time profile with every
coefficient x 1.1 (executor.cost_model=profile), so each simulated step takes 10% longer."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from experiments.statistics.compare import main as compare_main

from .helpers import ROOT, run_cli

PROFILE = ROOT / "results/profiles/cpu-amd-epyc-smollm2-135m-cpu-float32.json"
SIM = [
    "executor=sim",
    "executor.cost_model=profile",
    "model=smollm2-135m",
    "kernel=cpu",
    "trace=synthetic",
    "trace.num_requests=40",
    "trace.rate=0.5",
    "trace.prompt_len={dist:fixed,value:128}",
    "trace.output_len={dist:uniform,low:8,high:64}",
    "replay=open_loop",
]


def slower_profile(tmp_path, factor=1.1):
    data = json.loads(PROFILE.read_text())
    data["coefficients"] = {k: v * factor for k, v in data["coefficients"].items()}
    out = tmp_path / "slower.json"
    out.write_text(json.dumps(data))
    return out


def compare_cli(*args) -> tuple[str, dict]:
    """`python -m experiments.statistics.compare ARGS --json`: its printed table and its JSON."""
    out_json = f"{args[0]}.cmp.json"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.statistics.compare", *map(str, args), "--json", out_json],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(open(out_json).read())


def verdicts(data: dict) -> dict:
    return {m["metric"]: m["verdict"] for m in data["metrics"]}


def json_of(tmp_path, *args) -> dict:
    """experiments.statistics.compare's main, in this process, and its JSON."""
    out = tmp_path / "cmp.json"
    compare_main([*map(str, args), "--json", str(out), "--top", "0"])
    return json.loads(out.read_text())


def test_repeated_runs_and_single_runs_compare(tmp_path):
    """A through `python run.py` as a user types it; B and C through the same runner in this process (the
    CLI path is A's; each extra run.py would only start Python, torch and Hydra once more)."""
    from experiments.run.runner import run_trace

    from ..cluster.helpers import cfg

    a, b, c = (tmp_path / x for x in ("A", "B", "C"))
    run_cli(*SIM, f"executor.profile={PROFILE}", "replay.repeats=5", f"hydra.run.dir={a}")
    run_trace(cfg(*SIM, f"executor.profile={PROFILE}", "replay.repeats=5"), b)
    run_trace(cfg(*SIM, f"executor.profile={slower_profile(tmp_path)}", "replay.repeats=5"), c)
    # each folder holds its own table and intervals; the simulated repeats are one configuration whose
    # workload was redrawn, so the interval is not zero
    for folder in (a, b, c):
        table = pd.read_csv(folder / "sweep.csv")
        assert list(table["run_dir"]) == [f"repeat{i}" for i in range(5)] and table["config_id"].nunique() == 1
        assert table["redraw_workload"].all() and list(table["trace.seed"]) == [0, 1, 2, 3, 4]
    ci = pd.read_csv(a / "sweep_ci.csv").set_index("metric")
    assert (ci["n"] == 5).all()
    for metric in ("mean_e2el_ms", "p99_ttft_ms", "output_throughput"):
        assert ci.loc[metric, "ci_low"] < ci.loc[metric, "mean"] < ci.loc[metric, "ci_high"], metric
    outer = pd.read_csv(tmp_path / "sweep.csv")  # also the rows a single run would leave above
    assert len(outer) == 15 and outer["run_dir"].str.startswith(("A/", "B/", "C/")).all()

    # two identical configurations: the same seeds per repeat, so the simulator reproduces every pair
    text, same = compare_cli(a, b)
    assert same["design"] == "paired" and same["pairs"] == 5
    assert set(verdicts(same).values()) == {"no significant difference"}, text
    assert "could have detected differences larger than" in text
    # steps 10% slower: found at 5 paired repeats, in every latency mean and in TPOT's percentiles
    slower = json_of(tmp_path, a, c)
    v = verdicts(slower)
    assert {v[f"{s}_{m}_ms"] for s in ("mean", "p50") for m in ("ttft", "tpot", "e2el")} == {"A better"}, slower
    tpot = {m["metric"]: m for m in slower["metrics"]}["mean_tpot_ms"]
    assert 1.08 < tpot["b"] / tpot["a"] < 1.3, tpot  # 10% slower steps, and batches that stay fuller

    # two single runs (one repeat folder of each): the simulator's single pair is tested over requests
    single = json_of(tmp_path, a / "repeat0", c / "repeat0")
    assert single["pairs"] == 1 and verdicts(single)["mean_tpot_ms"] == "A better", single


@pytest.mark.slow
def test_two_sweep_folders_compare_with_where(tmp_path):
    """A seed sweep of both profiles, compared with --where-a / --where-b. It left trace.seed alone, so the
    three simulated runs per side are one workload draw: compared as one pair, over its requests."""
    s, slow = tmp_path / "S", slower_profile(tmp_path)
    run_cli("-m", *SIM, "seed=0,1,2", f"executor.profile={PROFILE},{slow}", f"hydra.sweep.dir={s}")
    text, sweep = compare_cli(s, s, "--where-a", f"executor.profile={PROFILE}", "--where-b", f"executor.profile={slow}")
    assert sweep["pairs"] == 1 and any("one workload draw" in n for n in sweep["notes"]), text
    assert verdicts(sweep)["mean_tpot_ms"] == "A better", text


def test_a_simulated_cluster_repeats_like_one_engine(tmp_path):
    """replay.repeats applies to a cluster too: its own folder, one configuration, a redrawn workload."""
    from experiments.cluster.runner import run_cluster

    from ..cluster.helpers import SIM as CLUSTER_SIM
    from ..cluster.helpers import SMALL_TRACE, cfg

    run_cluster(cfg(*CLUSTER_SIM, *SMALL_TRACE, "cluster.replicas=2", "replay.repeats=2"), tmp_path / "A", quiet=True)
    table = pd.read_csv(tmp_path / "A" / "sweep.csv")
    assert list(table["run_dir"]) == ["repeat0", "repeat1"] and table["config_id"].nunique() == 1
    assert list(table["trace.seed"]) == [0, 1] and (tmp_path / "A" / "sweep_ci.csv").exists()
    assert list(pd.read_csv(tmp_path / "sweep.csv")["run_dir"]) == ["A/repeat0", "A/repeat1"]


def test_repeats_of_the_built_in_prompt_set_are_refused(tmp_path):
    from omegaconf import OmegaConf

    from experiments.run.offline import run_offline

    with pytest.raises(ValueError, match="replay.repeats"):
        run_offline(None, None, tmp_path, OmegaConf.create({"replay": {"repeats": 3}}))


def test_a_repeat_that_never_started_leaves_no_row(tmp_path, monkeypatch):
    """Repeat 1 fails before replaying (no row of its own): the table above gets repeat 0's row once."""
    from experiments.run import repeats
    from experiments.run.runner import run_trace

    from ..cluster.helpers import SIM as SIM_8B
    from ..cluster.helpers import SMALL_TRACE, cfg

    calls = []

    def run_one(c, d):
        calls.append(d.name)
        if d.name == "repeat1":
            raise RuntimeError("no engine")
        return run_trace(c, d)

    with pytest.raises(RuntimeError, match="no engine"):
        repeats.run_repeats(cfg(*SIM_8B, *SMALL_TRACE, "replay.repeats=3"), tmp_path / "A", run_one=run_one)
    assert calls == ["repeat0", "repeat1"]
    assert list(pd.read_csv(tmp_path / "sweep.csv")["run_dir"]) == ["A/repeat0"]


def test_warmup_runs_come_first_and_stay_out_of_the_tables(tmp_path):
    """replay.warmup_runs=1: one run of repeat 0's configuration first, in warmup0/, then the measured
    repeats; neither the run folder's table nor the one above holds the warm-up's row."""
    from experiments.run import repeats
    from experiments.run.runner import run_trace

    from ..cluster.helpers import SIM as SIM_8B
    from ..cluster.helpers import SMALL_TRACE, cfg

    calls = []

    def run_one(c, d):
        calls.append((d.name, c.replay.repeat, c.seed))
        return run_trace(c, d)

    setup = cfg(*SIM_8B, *SMALL_TRACE, "replay.repeats=2", "replay.warmup_runs=1", "seed=7")
    out = repeats.run_repeats(setup, tmp_path / "A", run_one=run_one)
    assert calls == [("warmup0", 0, 7), ("repeat0", 0, 7), ("repeat1", 1, 8)]
    assert not list((tmp_path / "A").glob("*/warmup*"))  # no repeat runs warm-ups of its own
    assert out["repeats"] == 2 and (tmp_path / "A" / "warmup0" / "summary.json").exists()
    assert list(pd.read_csv(tmp_path / "A" / "sweep.csv")["run_dir"]) == ["repeat0", "repeat1"]
    assert list(pd.read_csv(tmp_path / "sweep.csv")["run_dir"]) == ["A/repeat0", "A/repeat1"]
    with pytest.raises(ValueError, match="replay.warmup_runs"):
        repeats.warmup_count(cfg(*SIM_8B, *SMALL_TRACE, "replay.warmup_runs=-1"))
