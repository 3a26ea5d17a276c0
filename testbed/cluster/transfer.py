"""One request's KV transfer from its prefill replica to its decode replica, and the blocks it holds."""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.cluster.replica import SimReplica
from testbed.outputs import RequestOutput
from testbed.request import Request
from testbed.sampling_params import SamplingParams


@dataclass
class KVTransfer:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # the request's own (the prefill replica ran it with max_tokens=1)
    arrival_time: float
    priority: int
    prefill: SimReplica
    prefill_output: RequestOutput  # its prefill (first scheduling, cached tokens, preemptions there)
    prefill_finish_time: float
    block_hashes: list[int]  # the leading full blocks the decode replica will use: (prompt - 1) // block_size
    decode: SimReplica  # the decode router's choice
    prefill_blocks: list = field(default_factory=list)  # held on the prefill replica until the transfer ends
    tail_blocks: int = 0  # blocks the decode replica needs beyond the moved ones: rest of prompt + 1 token
    # held on the decode replica from the transfer's start until the request is admitted there:
    # (hash, block, sent) with sent False for a block the decode replica already had cached
    decode_blocks: list = field(default_factory=list)
    num_bytes: int = 0
    start_time: float | None = None
    end_time: float | None = None
    decode_request: Request | None = None

    @property
    def prefill_preemptions(self) -> int:
        metrics = self.prefill_output.metrics
        return int(metrics.num_preemptions) if metrics else 0

    def columns(self) -> dict:
        """The request's row on its prompt side and its transfer (experiments.cluster.recording)."""
        metrics = self.prefill_output.metrics
        return {
            "prefill_replica": self.prefill.index,
            "first_scheduled_time": metrics.first_scheduled_time if metrics else None,
            "cached_tokens": int(metrics.num_cached_tokens) if metrics else 0,
            "prefill_finish_time": self.prefill_finish_time,
            "transfer_start_time": self.start_time,
            "transfer_end_time": self.end_time,
            "kv_transfer_bytes": self.num_bytes,
            "kv_transfer_s": None
            if self.start_time is None or self.end_time is None
            else self.end_time - self.start_time,
        }
