"""Clocks for the simulator.

`VirtualClock` is simulated time: it moves only when told (the simulated executor advances it by each
step's priced duration, a replay driver's `sleep` jumps it to the next arrival), so a run takes no wall
time and gives the same numbers every time.

`RecordingClock` wraps a real clock and keeps every reading; `ReplayClock` gives those readings back in
order. A real run's readings replayed into a simulated run of the same trace and config reproduce the
real run's time exactly (cost_model=replay_steps): the engine and the replay driver make the same
decisions from the same readings, so each request's timestamps come out the same, and any difference in
what the simulation does shows up as a different sequence of readings, which is an error.
"""

import time
from collections.abc import Callable

from testbed.isolation import RunInvalid


class VirtualClock:
    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock only moves forward, got {seconds} s")
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        """What a replay driver calls instead of time.sleep: simulated idle time."""
        self.now += max(0.0, seconds)


class RecordingClock:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.readings: list[float] = []

    def __call__(self) -> float:
        t = self.clock()
        self.readings.append(t)
        return t


class ClockDivergence(RunInvalid):
    """The simulated run read the clock more often than the recorded run: it made other decisions."""


class ReplayClock:
    def __init__(self, readings: list[float], source: str = "the recorded run"):
        self.readings = readings
        self.source = source
        self.position = 0

    def __call__(self) -> float:
        if self.position >= len(self.readings):
            raise ClockDivergence(
                f"the simulation read the clock more often than {self.source} ({len(self.readings)} readings): "
                "it did not make the same decisions"
            )
        t = self.readings[self.position]
        self.position += 1
        return t

    def sleep(self, seconds: float) -> None:
        """Idle time is in the recorded readings already."""

    @property
    def exhausted(self) -> bool:
        return self.position == len(self.readings)
