"""A recorded real run, for cost_model=replay_steps: its clock readings (clock.parquet) and the batch of
every step (steps.parquet), checked step by step against the simulation."""

from pathlib import Path

from testbed.sim.clock import ClockDivergence, ReplayClock


class RecordedRun:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        for name in ("clock.parquet", "steps.parquet"):
            if not (self.folder / name).exists():
                raise ValueError(
                    f"{self.folder} is not a recorded run: {name} is missing (real runs of `run.py` record it)"
                )
        import pandas as pd

        self.readings = pd.read_parquet(self.folder / "clock.parquet")["t"].tolist()
        steps = pd.read_parquet(self.folder / "steps.parquet")
        self.batches = list(zip(steps["num_seqs"], steps["num_prefill_tokens"], steps["num_decode_tokens"]))
        self.num_blocks = int(steps["kv_num_blocks"].iloc[0]) if len(steps) and "kv_num_blocks" in steps else None
        self.dtype = "float32"
        config = self.folder / "config.yaml"
        if config.exists():
            import yaml

            self.dtype = (yaml.safe_load(config.read_text()) or {}).get("dtype") or "float32"

    def clock(self) -> ReplayClock:
        return ReplayClock(self.readings, str(self.folder))

    def check_step(self, index: int, out) -> None:
        got = (len(out.requests), out.num_prefill_tokens, out.num_decode_tokens)
        if index >= len(self.batches):
            raise ClockDivergence(
                f"step {index}: the simulation ran more steps than {self.folder} ({len(self.batches)})"
            )
        want = tuple(int(x) for x in self.batches[index])
        if got != want:
            raise ClockDivergence(
                f"step {index}: the simulation scheduled (seqs, prefill, decode tokens) {got}, "
                f"the recorded run {want} ({self.folder})"
            )
