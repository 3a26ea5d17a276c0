"""An executor that runs no model: for measuring the engine's host-side cost per step.

It does the host half of a real step (the same block tables, staged inputs and buffers as ModelRunner)
and then "samples" a fixed token for every request that needs one. With it, an engine step is schedule +
KV-cache bookkeeping + input preparation + output handling, and nothing else. With `step_time_s` it holds
the "device" that long per step (sleeping, which frees the host): what a model of that speed would
leave to overlap with (async scheduling). Select it with `EngineConfig(executor="host")`
(testbed.executor.kind.HostKind).
"""

import time

from testbed.core.sched_output import SchedulerOutput
from testbed.executor.base import ExecutorOutput, StepExecutor
from testbed.executor.block_tables import BlockTables
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import ModelInputs, StagedInputs, stage_inputs


class HostExecutor(StepExecutor):
    def __init__(self, tables: BlockTables, buffers: InputBuffers, token_id: int, step_time_s: float = 0.0):
        self.tables = tables
        self.input_buffers = buffers
        self.token_id = token_id  # never an EOS id: requests end at their length
        self.step_time_s = step_time_s
        self.cuda_graphs = None
        self.last_inputs: ModelInputs | None = None

    def prepare(self, out: SchedulerOutput) -> StagedInputs:
        self.tables.apply(out.finished_ids, out.block_updates)
        return stage_inputs(out, self.tables, self.input_buffers)

    def run(self, staged: StagedInputs, last_tokens: dict[str, int]) -> ExecutorOutput:
        inputs = self.last_inputs = staged.to_device(last_tokens)
        if self.step_time_s:
            time.sleep(self.step_time_s)
        token = self.token_id
        return ExecutorOutput([[token] if k else None for k in inputs.num_logits])
