"""An executor that runs no model: for measuring the engine's host-side cost per step.

It does the host half of a real step (the same block tables, `prepare_inputs` and staging buffers as
ModelRunner) and then "samples" a fixed token for every request that needs one. With it, an engine step
is schedule + KV-cache bookkeeping + input preparation + output handling, and nothing else.
Select it with `EngineConfig(executor="null")` (no weights, no KV tensors).
"""

from testbed.core.scheduler import SchedulerOutput
from testbed.executor.base import ExecutorOutput
from testbed.executor.block_tables import BlockTables
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import ModelInputs, prepare_inputs


class NullExecutor:
    def __init__(self, tables: BlockTables, buffers: InputBuffers, token_id: int):
        self.tables = tables
        self.input_buffers = buffers
        self.token_id = token_id  # never an EOS id: requests end at their length
        self.cuda_graphs = None
        self.last_inputs: ModelInputs | None = None

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        self.tables.apply(out.finished_ids, out.block_updates)
        inputs = self.last_inputs = prepare_inputs(out, self.tables, self.input_buffers)
        token = self.token_id
        return ExecutorOutput([[token] if k else None for k in inputs.num_logits])
