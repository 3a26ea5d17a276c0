"""experiments.calibration.calibrate checks itself: it refuses (writes nothing) when its fit does not describe its own
steps or the machine's speed drifted while it measured, unless --force; the profile records both. Timings
are injected (planted step periods and probe readings), so the refusals do not depend on this machine."""

import itertools
import json
import random
import re

import pytest

import experiments.calibration.calibrate as calibrate
from experiments.calibration.probe import SelfCheck, drift

from .test_cost_models import synthetic_shapes

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# cache.memory_gb: the engine zeroes its whole KV budget at start-up (default 1 GiB); the planted steps use none
ENGINE = ["model=tiny", "kernel=torch", "cache.memory_gb=0.0625", "--quick", "--no-operators", "--warmup", "1"]


def step_time(s):
    return 2e-3 + 5e-5 * s.num_seqs + 1e-4 * max(32, s.num_tokens) + 3e-9 * s.prefill_pairs + 4e-8 * s.decode_context


def plant(monkeypatch, noise: float, probes: list[float]):
    """Every calibration workload's steps follow step_time() times 1 +- noise (alternating); the probe
    reads `probes` in turn (start, middle, end)."""
    rng = random.Random(0)
    signs = itertools.cycle([1, -1])

    def measure(engine, lengths, seed, sequential=False):
        shapes = synthetic_shapes(30, seed=rng.randrange(1 << 30))
        return shapes, [step_time(s) * (1 + noise * next(signs)) for s in shapes]

    readings = iter(probes)
    monkeypatch.setattr(calibrate, "measure", measure)
    monkeypatch.setattr(calibrate, "probe_seconds", lambda engine, repeats: next(readings))


def refusal(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("REFUSED")]
    assert len(lines) == 1
    return lines[0]


def test_a_clean_calibration_is_written_with_its_self_check(monkeypatch, tmp_path):
    plant(monkeypatch, noise=0.01, probes=[0.100, 0.104, 0.102])
    path = calibrate.main([*ENGINE, "--out", str(tmp_path)])
    profile = json.loads(path.read_text())
    check = profile["self_check"]
    assert check["passed"] and not check["forced"] and check["failures"] == []
    assert check["probe_seconds"] == [0.100, 0.104, 0.102]
    assert check["drift"] == pytest.approx(0.04)
    assert check["fit_median_abs_rel_err"] == profile["fit"]["median_abs_rel_err"] < 0.02


def test_refused_when_the_fit_misses_its_own_steps(monkeypatch, tmp_path, capsys):
    plant(monkeypatch, noise=0.3, probes=[0.1, 0.1, 0.1])  # +-30% scatter no model can follow
    assert calibrate.main([*ENGINE, "--out", str(tmp_path)]) is None
    assert not list(tmp_path.iterdir())
    err = refusal(capsys)
    assert re.search(r"median \|error\| is 3\d\.\d% \(limit 10%\)", err) and "drifted" not in err


def test_refused_when_the_probe_drifted(monkeypatch, tmp_path, capsys):
    plant(monkeypatch, noise=0.01, probes=[0.100, 0.105, 0.115])  # the machine slowed 15% while measuring
    assert calibrate.main([*ENGINE, "--out", str(tmp_path)]) is None
    assert not list(tmp_path.iterdir())
    err = refusal(capsys)
    assert "probe drifted 15.0% (limit 10%" in err and "median |error|" not in err


def test_force_writes_a_refused_profile_marked_so(monkeypatch, tmp_path):
    plant(monkeypatch, noise=0.3, probes=[0.100, 0.105, 0.115])
    path = calibrate.main([*ENGINE, "--out", str(tmp_path), "--force"])
    check = json.loads(path.read_text())["self_check"]
    assert not check["passed"] and check["forced"] and len(check["failures"]) == 2
    assert check["drift"] == pytest.approx(0.15)


def test_thresholds_are_the_commands():
    check = SelfCheck.of(0.12, [1.0, 1.12], max_fit_error=0.15, max_drift=0.15)
    assert check.passed
    assert not SelfCheck.of(0.12, [1.0, 1.0]).passed  # defaults: 10%
    assert drift([1.0, 0.8, 0.9]) == pytest.approx(0.25)


def test_full_plan_still_reaches_the_largest_batch_at_every_context_it_keeps():
    """Long contexts stop at 16 requests (larger batches there only add 512-token chunks), yet the plan
    still decodes 64 at once, so a profile's calibrated max_seqs covers the study's max_num_seqs=64."""
    decode = [re.match(r"decode b=(\d+) ctx=(\d+)", name) for name, *_ in calibrate.workloads(2048, quick=False)]
    batches = {(int(m[1]), int(m[2])) for m in decode if m}
    assert max(b for b, _ in batches) == 64
    assert {b for b, c in batches if c == 1000} == {1, 2, 4, 8, 16}
    assert {b for b, c in batches if c == 48} == {1, 2, 4, 8, 16, 32, 64}
