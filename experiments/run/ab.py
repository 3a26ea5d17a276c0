"""Two configurations run alternately, then compared: an interleaved A/B experiment.

    python -m experiments.run.ab --a "scheduler.max_num_seqs=4" --b "scheduler.max_num_seqs=8" \\
        --pairs 5 --warmup 1 --out results/ab/seqs  model=smollm2-135m trace=synthetic ...

The trailing overrides are common to both sides; --a / --b add each side's own (either may be empty: two
identical sides are the null check). Every run is `run.py` with those overrides, in its own process, so each
override is composed and checked as run.py does, and no state of one run (allocator, kernel caches, frozen
objects, a torch thread pool) reaches the next: each run is what a researcher's separate invocation
measures. (In one process a later run starts warmer than an earlier one, and both sides would have to be
buildable side by side.) Warm-ups, both discarded: `replay.warmup_runs=K` (a common override) runs K runs of
the configuration in each run's own process before the measured one (in repeat<i>/warmup<k>/), so the
measured run starts warm as a repeat does in one process (experiments.run.repeats); `--warmup N` runs N whole
runs per side first, warming the machine (page cache, clocks, kernel builds).

Order: warm-up runs A, B, then pair i runs A then B for even i and B then A for odd i (AB BA AB BA ...): the
order balanced for a linear trend (Cox 1951, "Some systematic experimental designs", Biometrika 38; the
ABBA counterbalancing of within-subject designs), so a machine drifting linearly in time adds no
difference over each two pairs; with an odd number of pairs the last pair keeps 1/pairs of a slot's drift.
Interleaving rather than running the sides one after the other follows Kalibera & Jones (2013, "Rigorous
benchmarking in reasonable time"): the machine's slow changes then fall on both sides alike.

Pair i of both sides runs with replay.repeat=i and the seeds experiments.run.repeats gives repeat i (so the
same requests on both sides: the paired design of experiments.statistics.compare). <out>/A and <out>/B are repeated
runs' folders (repeat<i>/, warmup<k>/, sweep.csv, sweep_ci.csv) that `python -m experiments.statistics.compare
<out>/A <out>/B` reads; <out>/ab.json records the command and each run's slot, start and exit status,
rewritten after every run; <out>/compare.txt and compare.json hold the comparison. `--primary METRIC` (recorded
in ab.json before the first run) makes one metric the comparison's primary, tested alone at the full 5%
(experiments.statistics.compare). Ctrl-C or SIGTERM stops after the run in flight has written what it measured
(run.py keeps a partial run, marked interrupted); finished runs stay and are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from hydra.errors import HydraException

from experiments.results.atomic import atomic_write_text
from experiments.results.files import SWEEP_TABLE
from experiments.statistics.aggregate import write_aggregate
from experiments.statistics.compare import CompareError, check_metrics, compare
from experiments.statistics.seeds import WORKLOAD_SEEDS

SIDES = ("A", "B")
# set by the runner for each run: a user's value would be overwritten
RESERVED = ("replay.repeats", "replay.repeat", "results.sweep_table", "hydra.run.dir")
DESIGN = "warm-ups A B, then pairs AB BA AB ... (balanced for a linear trend; Cox 1951)"


class ABError(ValueError):
    pass


@dataclass(frozen=True)
class Slot:
    side: str  # A | B
    run: str  # warmup<k> | repeat<i>
    index: int  # the repeat whose seeds it runs with (warm-ups: repeat 0's, as replay.warmup_runs)
    pair: int | None  # None for a warm-up


def schedule(pairs: int, warmup: int) -> list[Slot]:
    """The run order: warm-ups alternate A/B (A first), then pair i is AB for even i and BA for odd i."""
    out = []
    for k in range(warmup):
        order = SIDES if k % 2 == 0 else SIDES[::-1]
        out += [Slot(s, f"warmup{k}", 0, None) for s in order]
    for i in range(pairs):
        order = SIDES if i % 2 == 0 else SIDES[::-1]
        out += [Slot(s, f"repeat{i}", i, i) for s in order]
    return out


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def check_overrides(overrides: list[str]) -> None:
    for o in overrides:
        if o in ("-m", "--multirun") or _key(o).startswith("hydra.sweep"):
            raise ABError(f"{o}: the runner runs single runs (pairs come from --pairs)")
        if _key(o) in RESERVED:
            raise ABError(f"{_key(o)}: set by the runner (--pairs, --warmup, --out), not an override")


def compose(overrides: list[str]):
    """The composed config run.py would get, checked as run.py checks it (experiments.run.settings.run_settings)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from experiments.run.settings import run_settings

    with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
        cfg = hydra_compose("config", overrides=[o for o in overrides if not _key(o).startswith("hydra.")])
    run_settings(cfg)
    if not cfg.get("trace") or cfg.mode not in (None, "replay"):
        raise ABError("the runner compares replays: give a trace (trace=synthetic|azure|...), mode=replay")
    return cfg


def repeat_overrides(cfg, pairs: int) -> list[list[str]]:
    """Per repeat i: the overrides that give it experiments.run.repeats' seeds (replay.repeat=i, the redraw
    setting resolved, each seed key offset by i)."""
    from omegaconf import OmegaConf

    from experiments.run.repeats import repeat_configs

    keys = list(OmegaConf.select(cfg, "replay.repeat_seeds") or ["seed"])
    keys += [k for k in WORKLOAD_SEEDS if k not in keys and OmegaConf.select(cfg, k) is not None]
    out = []
    for c in repeat_configs(cfg, pairs):
        redraw = str(OmegaConf.select(c, "replay.redraw_workload")).lower()
        out.append(
            [f"replay.repeat={c.replay.repeat}", f"replay.redraw_workload={redraw}"]
            + [f"{k}={OmegaConf.select(c, k)}" for k in keys]
        )
    return out


def same_workload(cfg_a, cfg_b) -> None:
    """Both sides replay the same requests (the paired design): the trace and the seeding agree."""
    from omegaconf import OmegaConf

    for key in ("trace", "replay.repeat_seeds", "replay.redraw_workload", *WORKLOAD_SEEDS):
        va, vb = OmegaConf.select(cfg_a, key), OmegaConf.select(cfg_b, key)
        if OmegaConf.is_config(va):
            va, vb = OmegaConf.to_container(va, resolve=True), OmegaConf.to_container(vb, resolve=True)
        if va != vb:
            raise ABError(f"A and B differ in {key} ({va!r} vs {vb!r}): the design is paired, both replay one workload")


def run_command(overrides: list[str]) -> list[str]:
    """run.py of the package this module came from, else the installed `run` module (testbed-run)."""
    script = Path(__file__).resolve().parents[2] / "run.py"
    head = [sys.executable, str(script)] if script.exists() else [sys.executable, "-m", "run"]
    return head + overrides


class Runner:
    def __init__(
        self, out: Path, common: list[str], sides: dict[str, list[str]], pairs: int, warmup: int, primary: str | None
    ):
        self.out, self.common, self.sides = out, common, sides
        self.slots = schedule(pairs, warmup)
        self.runs: list[dict] = []  # one entry per run, in the order run
        self.record = {
            "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "design": DESIGN,
            "primary": primary,  # declared before the first run, as a primary endpoint must be
            "pairs": pairs,
            "warmup": warmup,
            "common": common,
            "a": sides["A"],
            "b": sides["B"],
            "runs": self.runs,
        }
        self.child: subprocess.Popen | None = None

    def overrides(self, slot: Slot, seeds: list[str]) -> list[str]:
        side = self.out / slot.side
        table = side / slot.run / SWEEP_TABLE if slot.pair is None else side / SWEEP_TABLE
        extra = [] if any(_key(o) == "progress" for o in self.common) else ["progress=false"]
        return [
            *self.common,
            *self.sides[slot.side],
            *extra,
            "replay.repeats=1",
            *seeds,
            f"hydra.run.dir={side / slot.run}",
            f"results.sweep_table={table}",
        ]

    def run(self, seeds: dict[str, list[list[str]]]) -> bool:
        """Every slot in order; False when stopped by a signal or a failed run (finished runs stay)."""
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        for n, slot in enumerate(self.slots, 1):
            cmd = run_command(self.overrides(slot, seeds[slot.side][slot.index]))
            log = self.out / "logs" / f"{n:02d}-{slot.side}-{slot.run}.log"
            what = "warm-up" if slot.pair is None else f"pair {slot.pair + 1}"
            left = ""
            if n > 1:
                left = f", ~{(time.monotonic() - began) / (n - 1) * (len(self.slots) - n + 1):.0f} s left"
            print(f"[{n}/{len(self.slots)}] {slot.side} {slot.run} ({what}{left})", file=sys.stderr, flush=True)
            entry = {"slot": n, "side": slot.side, "run": slot.run, "pair": slot.pair}
            entry["start_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            t0 = time.monotonic()
            rc, stopped = self._child(cmd, log)
            entry.update(seconds=round(time.monotonic() - t0, 2), exit_code=rc)
            self.runs.append(entry)
            atomic_write_text(self.out / "ab.json", json.dumps(self.record, indent=2) + "\n")
            print(f"    {_brief(self.out / slot.side / slot.run)} ({entry['seconds']:.1f} s)", file=sys.stderr)
            if stopped or rc != 0:
                tail = log.read_text(errors="replace")[-2000:] if rc != 0 and not stopped else ""
                print(f"stopped at run {n} ({slot.side} {slot.run}, exit {rc}); log {log}\n{tail}", file=sys.stderr)
                return False
        return True

    def _child(self, cmd: list[str], log: Path) -> tuple[int, bool]:
        """Run one child; a SIGINT/SIGTERM here lets it write what it measured (run.py's own handling)."""
        stopped = []

        def forward(signum, _frame):
            stopped.append(signum)
            if self.child is not None and signum == signal.SIGTERM:
                self.child.send_signal(signum)  # Ctrl-C reaches the child itself (one process group)

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            with open(log, "w") as f:
                self.child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_child_env())
                rc = self.child.wait()
        finally:
            self.child = None
            for s, h in old.items():
                signal.signal(s, h)
        return rc, bool(stopped) or rc in (128 + signal.SIGINT, 128 + signal.SIGTERM)


def _child_env() -> dict[str, str]:
    """This package first on the child's path (a worktree or checkout next to an installed copy)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def _brief(run_dir: Path) -> str:
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return "no summary"
    state = " INTERRUPTED" if s.get("interrupted") else (" FAILED" if s.get("error") else "")
    return (
        f"mean TPOT {s.get('mean_tpot_ms', float('nan')):.2f} ms, mean TTFT {s.get('mean_ttft_ms', float('nan')):.1f} "
        f"ms, {s.get('output_throughput', float('nan')):.1f} tok/s{state}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", default="", help="A's own overrides, one shell-quoted string (may be empty)")
    ap.add_argument("--b", default="", help="B's own overrides (may be empty: identical sides)")
    ap.add_argument("--pairs", type=int, default=5, help="measured runs per side (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded runs per side first (default 1)")
    ap.add_argument("--out", required=True, type=Path, help="folder for A/, B/, ab.json, compare.txt (new or empty)")
    ap.add_argument("--metric", action="append", help="compare only these metrics (as experiments.statistics.compare)")
    ap.add_argument(
        "--primary",
        help="the pre-declared primary metric, tested alone at the full 5%% (as experiments.statistics.compare); "
        "recorded in ab.json before the first run",
    )
    ap.add_argument("overrides", nargs="*", help="overrides common to both sides (run.py's)")
    args = ap.parse_args(argv)
    sides = {"A": shlex.split(args.a), "B": shlex.split(args.b)}
    try:
        check_metrics(args.metric or [], "--metric")
        check_metrics([args.primary] if args.primary else [], "--primary")
        if args.pairs < 1 or args.warmup < 0:
            raise ABError(f"--pairs >= 1 and --warmup >= 0, got {args.pairs} and {args.warmup}")
        if args.out.exists() and any(args.out.iterdir()):
            raise ABError(f"--out {args.out}: not empty (the runner writes a fresh A/ and B/)")
        for overrides in (args.overrides, *sides.values()):
            check_overrides(overrides)
        cfgs = {s: compose(args.overrides + sides[s]) for s in SIDES}  # refused here, before any run
        same_workload(cfgs["A"], cfgs["B"])
        seeds = {s: repeat_overrides(cfgs[s], args.pairs) for s in SIDES}
    except (ValueError, TypeError, KeyError, HydraException) as e:  # what run.py refuses, refused here
        cause = f" ({e.__cause__})" if isinstance(e, HydraException) and e.__cause__ else ""
        print(f"experiments.run.ab: {e}{cause}", file=sys.stderr)
        return 2
    runner = Runner(args.out, args.overrides, sides, args.pairs, args.warmup, args.primary)
    try:
        finished = runner.run(seeds)
    except KeyboardInterrupt:  # between two runs: the finished ones stay
        print("stopped between runs", file=sys.stderr)
        finished = False
    for s in SIDES:
        if (args.out / s / SWEEP_TABLE).exists():
            write_aggregate(args.out / s / SWEEP_TABLE)
    return _compare(args.out, args.metric, args.primary, finished)


def _compare(out: Path, metrics: list[str] | None, primary: str | None, finished: bool) -> int:
    try:
        result = compare(out / "A", out / "B", metrics=metrics, primary=primary)
    except CompareError as e:
        print(f"experiments.run.ab: nothing to compare yet ({e})", file=sys.stderr)
        return 1
    text = result.text()
    atomic_write_text(out / "compare.txt", text + "\n")
    atomic_write_text(out / "compare.json", json.dumps(result.to_dict(), indent=2, default=float) + "\n")
    print(text)
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
