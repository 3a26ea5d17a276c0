"""What the engine reports of the steps it ran: one StepStats per step, or a StepRun for a run of decode
steps a simulation advanced in one go (testbed.sim.decode_runs), column by column."""

from dataclasses import dataclass, field, fields
from operator import attrgetter

from testbed.core.allocators.base import KVCacheStats
from testbed.core.allocators.counter_spans import CounterSpans


@dataclass
class StepStats:
    step: int
    start_time: float
    duration_s: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    num_waiting: int
    num_running: int
    kv: KVCacheStats
    grammar_time_s: float = 0.0  # structured output's share of the step (grammar masks, matcher updates)
    # who ran (for explaining latency differences, experiments.statistics.compare): ids in batch order, the tokens
    # each got, those that were prefilling (a prompt chunk, or recomputation after a preemption), and
    # the requests preempted in this step
    scheduled_ids: list[str] = field(default_factory=list)
    scheduled_tokens: list[int] = field(default_factory=list)
    prefill_ids: list[str] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)


KV_FIELDS = tuple(f.name for f in fields(KVCacheStats))
_kv_values = attrgetter(*KV_FIELDS)


def kv_compact(stats: KVCacheStats):
    """A KVCacheStats as the tuple of its fields (a tuple of ints the garbage collector stops tracking:
    a run keeps one per step); any other stats object as it is."""
    return _kv_values(stats) if type(stats) is KVCacheStats else stats


def kv_stats_of(compact) -> KVCacheStats:
    return KVCacheStats(*compact) if type(compact) is tuple else compact


@dataclass
class StepRun:
    """Consecutive pure decode steps with one batch: the same requests, one token each, none prefilling,
    preempted or waiting, none finishing but in the last step (num_finished). Per step only the times and
    the cache's state differ, and the last step's num_running."""

    first_step: int  # the step number of the first
    start_times: list[float]
    end_times: list[float]  # the clock after each step (its duration is end - start, as StepStats')
    kv: list | CounterSpans  # the cache's state after each step (kv_compact each)
    num_waiting: int
    scheduled_ids: list[str]
    grammar_time_s: float = 0.0  # the first step's (what the engine had gathered since the last step)
    num_finished: int = 0  # requests that finished in the last step: its num_running is num_seqs less these
    scheduled_tokens: list[int] = field(init=False)  # one each

    def __post_init__(self) -> None:
        self.scheduled_tokens = [1] * len(self.scheduled_ids)

    def __len__(self) -> int:
        return len(self.start_times)

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled_ids)

    def durations(self) -> list[float]:
        return [end - start for start, end in zip(self.start_times, self.end_times)]

    def step(self, j: int, kv=None) -> StepStats:
        """The StepStats step j of the run would have had, stepped one by one (kv: its cache state, if
        the caller has it)."""
        n, start = self.num_seqs, self.start_times[j]
        return StepStats(
            self.first_step + j,
            start,
            self.end_times[j] - start,
            n,
            0,
            n,
            0,
            self.num_waiting,
            n - self.num_finished if j == len(self) - 1 else n,
            kv_stats_of(self.kv[j] if kv is None else kv),
            self.grammar_time_s if j == 0 else 0.0,
            self.scheduled_ids,
            self.scheduled_tokens,
            [],
            [],
        )

    def step_stats(self) -> list[StepStats]:
        return [self.step(j, kv) for j, kv in enumerate(self.kv)]
