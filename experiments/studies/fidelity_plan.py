"""The fidelity study's workloads: per trace, closed loop at several concurrencies and open loop at
fractions of the capacity the real engine measured in its most concurrent closed-loop cell.

Traces (all held out from experiments.calibration.calibrate's synthetic calibration workloads):
  synthetic  Poisson arrivals (the synthetic generator), prompts 32-256 and outputs 16-64 tokens, uniform
  azure      the Azure LLM inference 2023 conversation trace: /work/shared/traces' full copy when present
             (TESTBED_TRACES or ../shared/traces), else the shipped sample; lengths / 16, prompts <= 256,
             outputs <= 48 so a CPU runs it
  mooncake   the Mooncake FAST'25 synthetic trace (shared copy or the shipped sample), lengths x 0.02
Open-loop cells replay the trace's own arrival pattern scaled to the target rate (trace.time_scale), or
for the synthetic generator its Poisson rate (trace.rate).
"""

import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = {"azure": "azure_llm_2023_conv.csv", "mooncake": "mooncake_fast25_synthetic.jsonl"}
TRACES = ("synthetic", "azure", "mooncake")


def shared_traces() -> Path:
    return Path(os.environ.get("TESTBED_TRACES", ROOT.parent.parent / "shared" / "traces"))


def trace_overrides(trace: str, num_requests: int) -> list[str]:
    if trace == "synthetic":
        return [
            "trace=synthetic",
            f"trace.num_requests={num_requests}",
            "trace.prompt_len={dist:uniform,low:32,high:256}",
            "trace.output_len={dist:uniform,low:16,high:64}",
        ]
    if trace not in SHARED:
        raise ValueError(f"unknown fidelity trace {trace!r}; known: {TRACES}")
    shared = shared_traces() / SHARED[trace]
    scale = {"azure": 0.0625, "mooncake": 0.02}[trace]
    return [
        f"trace={trace}",
        *([f"trace.path={shared}"] if shared.exists() else []),
        f"trace.max_requests={num_requests}",
        f"replay.length_scale={scale}",
        "replay.max_prompt_tokens=256" if trace == "azure" else "replay.max_prompt_tokens=384",
        "replay.max_output_tokens=48",
    ]


@dataclass(frozen=True)
class Cell:
    trace: str
    mode: str  # closed | open
    level: float  # concurrency (closed) or fraction of the measured capacity (open)
    num_requests: int

    @property
    def name(self) -> str:
        if self.mode == "closed":
            return f"{self.trace}_closed_c{int(self.level)}"
        return f"{self.trace}_open_{round(100 * self.level)}pct"

    def overrides(self, capacity: float | None = None, native_rate: float | None = None) -> list[str]:
        """Hydra overrides of this cell; open cells need the capacity (req/s) and, for a file trace, the
        trace's own mean arrival rate (req/s) to scale its arrivals to level x capacity."""
        base = trace_overrides(self.trace, self.num_requests)
        if self.mode == "closed":
            return [*base, "replay=closed_loop", f"replay.concurrency={int(self.level)}"]
        if capacity is None:
            raise ValueError(f"{self.name}: the open-loop rate needs the measured capacity first")
        rate = self.level * capacity
        if self.trace == "synthetic":
            return [*base, "replay=open_loop", f"trace.rate={rate:.6g}"]
        if native_rate is None:
            raise ValueError(f"{self.name}: scaling a file trace's arrivals needs its native arrival rate")
        return [*base, "replay=open_loop", f"trace.time_scale={rate / native_rate:.6g}"]


def cells(trace: str, concurrency: list[int], loads: list[float], scale: float) -> tuple[list[Cell], list[Cell]]:
    """(closed cells, open cells) of one trace; request counts x scale (at least 4, and 3x the concurrency
    so the closed loop reaches a steady state)."""
    n = lambda k: max(4, int(k * scale))
    closed = [Cell(trace, "closed", c, max(n(64), 3 * c if scale >= 1 else n(3 * c))) for c in concurrency]
    return closed, [Cell(trace, "open", f, n(64)) for f in loads]


def native_rate(cfg, engine) -> float:
    """Requests per second of the trace as selected (before any time_scale): n / arrival span."""
    from experiments.run.runner import config_value, trace_vocab_size
    from experiments.traces import load_trace

    trace = load_trace(config_value(cfg, "trace"), trace_vocab_size(engine), engine.max_model_len)
    arrivals = sorted(r.arrival_s for r in trace.requests)
    span = arrivals[-1] - arrivals[0]
    if len(arrivals) < 2 or span <= 0:
        raise ValueError("the trace's arrivals span no time: an open-loop rate cannot be set by scaling it")
    scale = float(config_value(cfg, "trace.time_scale", 1.0))
    return (len(arrivals) - 1) / span / scale
