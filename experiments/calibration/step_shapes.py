"""Recording the steps of a real engine: each step's shape (testbed.sim.shape) and its period.

Instrumentation for calibration (experiments.calibration.calibrate) and fidelity measurements
(experiments.studies.fidelity), not part of a normal run.
"""

import random

from testbed import SamplingParams
from testbed.sim.shape import StepShape


class StepShapes:
    """While active (a context manager), records each step of an engine: its shape (taken inside execute,
    before the forward) and its start time. Instrumentation for calibration and fidelity measurements,
    not part of a normal run: it wraps the executor's execute and removes the wrapper on exit."""

    def __init__(self, engine):
        self.engine = engine
        self.shapes: list[StepShape] = []
        self.starts: list[float] = []
        self.busy: list[bool] = []  # work was left after the step: the next one followed at once (no idle wait)

    def __enter__(self) -> "StepShapes":
        executor = self.engine.executor
        execute = executor.execute

        def shaped(out):
            self.shapes.append(StepShape.of(out))
            return execute(out)

        executor.execute = shaped
        self.engine.step_callbacks.append(self._on_step)
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.executor.execute  # the instance attribute: the class's method shows again
        self.engine.step_callbacks.remove(self._on_step)

    def _on_step(self, stats) -> None:
        self.starts.append(stats.start_time)
        self.busy.append(stats.num_running + stats.num_waiting > 0)

    def periods(self, end: float | None = None) -> list[float]:
        """Start-to-next-start of each step (the last one ends at `end`, or is dropped)."""
        nxt = self.starts[1:] + ([end] if end is not None else [])
        return [b - a for a, b in zip(self.starts, nxt)]


def measure(
    engine, lengths: list[tuple[int, int]], seed: int, sequential: bool = False
) -> tuple[list[StepShape], list[float]]:
    """Run one workload offline, back to back; (shapes, periods) of its steps but the last. All requests are
    submitted at once, or with `sequential` each once the one before it finished, so each runs alone (a closed
    loop at concurrency 1 with no think time)."""
    rng = random.Random(seed)
    vocab = engine.arch.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(prompt)] for prompt, _ in lengths]  # drawn before timing
    with StepShapes(engine) as recorder:
        for i, (ids, (_, output)) in enumerate(zip(prompts, lengths)):
            params = SamplingParams(temperature=0.0, max_tokens=output, ignore_eos=True)
            engine.add_request(f"c{seed}-{i}", ids, params)
            if sequential:
                _drain(engine)
        _drain(engine)
    periods = recorder.periods()
    return recorder.shapes[: len(periods)], periods


def _drain(engine) -> None:
    while engine.has_unfinished():
        engine.step()
