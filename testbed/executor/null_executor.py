"""An executor that runs no model: for measuring the engine's host-side cost per step.

It does the host half of a real step (the same `prepare_inputs`, block tables and staging buffers as
ModelRunner) and then "samples" a fixed token for every request that needs one. With it, an engine step
is schedule + KV-cache bookkeeping + input preparation + output handling, and nothing else.
Select it with `EngineConfig(executor="null")` (no KV tensors are allocated).
"""

from testbed.core.scheduler import SchedulerOutput
from testbed.executor.host_buffers import InputBuffers
from testbed.executor.inputs import prepare_inputs
from testbed.executor.model_runner import ExecutorOutput


class NullExecutor:
    def __init__(self, buffers: InputBuffers, block_size: int, token_id: int = 0):
        self.input_buffers = buffers
        self.block_size = block_size
        self.token_id = token_id
        self.cuda_graphs = None
        self.last_inputs = None

    @classmethod
    def for_engine(cls, engine) -> "NullExecutor":
        eos = set(engine.eos_token_ids)
        token = next(t for t in range(len(eos) + 1) if t not in eos)  # never ends a request by itself
        return cls(InputBuffers.for_engine(engine, static=False, device="cpu"), engine.config.block_size, token)

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        inputs = prepare_inputs(out, None, self.block_size, "cpu", self.input_buffers)
        self.last_inputs = inputs
        token = self.token_id
        return ExecutorOutput([[token] if k else None for k in inputs.num_logits], None)
