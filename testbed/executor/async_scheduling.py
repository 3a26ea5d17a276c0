"""Async scheduling: an executor's steps run on one worker thread, in the order submitted, so the host
schedules and prepares step N+1 while step N runs (vLLM's async scheduling, SGLang's overlap scheduler).

The host half of a step (`Executor.prepare`: block tables, staged inputs) runs on the caller's thread; the
device half (`Executor.run`: copies, forward, sampling) on the worker, which fills the inputs of a
decoding request, whose token the previous step was still sampling when the next one was prepared, from
that step's result. Torch releases the GIL in its kernels (and a CUDA step is asynchronous until its
tokens are read), so the host's Python work overlaps the device's: a step takes max(host, device)
instead of their sum.
"""

from concurrent.futures import Future, ThreadPoolExecutor

from testbed.core.sched_output import SchedulerOutput
from testbed.executor.base import ExecutorOutput


class AsyncStepRunner:
    """Runs an executor's steps on one worker thread, in the order submitted."""

    def __init__(self, executor):
        self.executor = executor
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="testbed-step")
        self.last_tokens: dict[str, int] = {}  # the worker's: request id -> its last sampled token

    def submit(self, out: SchedulerOutput) -> Future[ExecutorOutput]:
        prepared = self.executor.prepare(out)
        return self.worker.submit(self._run, out, prepared)

    def _run(self, out: SchedulerOutput, prepared) -> ExecutorOutput:
        result = self.executor.run(prepared, self.last_tokens)
        # a request the step failed for has no token (None): its next step's placeholder is discarded
        self.last_tokens = {
            r.request_id: t[-1] for r, t in zip(out.requests, result.sampled) if t and t[-1] is not None
        }
        return result

    def close(self) -> None:
        self.worker.shutdown(wait=True)
