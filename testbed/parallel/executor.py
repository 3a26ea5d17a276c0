"""Rank 0's side of tensor parallelism: start the workers, send each step, run rank 0's shard, clean up.

vLLM's multiprocessing executor, in the engine's process: the scheduler and block pool stay here, rank 0's
ModelRunner samples, the workers follow (testbed.parallel.worker). Failure is fail-stop: a worker that died
or a collective that timed out (parallel.timeout_s) raises TensorParallelError naming the rank, the engine
fails that step's requests, and every later step raises at once (the group cannot be trusted again).
"""

import logging
import multiprocessing.connection
import socket
import time
import weakref

import torch
import torch.multiprocessing as mp

from testbed.executor.base import ExecutorOutput, StepExecutor
from testbed.parallel.comm import TensorParallelError, TPGroup, env_rank, init_default, make_group
from testbed.parallel.messages import worker_step
from testbed.parallel.sharding import build_rank_model
from testbed.parallel.worker import JOIN_TIMEOUT_S, WorkerPlan, run_worker

logger = logging.getLogger(__name__)

# how long the ranks the engine spawns have to start (import torch, join) before the engine gives up
SPAWN_JOIN_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list, group: TPGroup | None) -> None:
    """Workers ended: asked to stop if the group still works, else (or if they do not) killed."""
    if group is not None:
        try:
            group.send(("stop",))
        except Exception:  # the group is broken: kill below
            logger.debug("tensor parallel: the stop command did not reach every worker", exc_info=True)
    for p in procs:
        if group is None:  # nothing asks it to end: waiting would only wait out a hung or idle worker
            p.kill()
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
    if group is not None:
        group.close()
    elif torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class TensorParallel:
    """The started group on rank 0: its workers (none under torchrun) and the plan they built from."""

    def __init__(self, plan: WorkerPlan):
        config = plan.config
        n = config.parallel.tensor_parallel_size
        if torch.distributed.is_initialized():
            raise ValueError("a process group is already initialized here: one tensor-parallel engine per process")
        launched = env_rank()
        self.procs: list = []
        if launched is not None:  # torchrun / srun started every rank: this is rank 0
            if launched != (0, n):
                raise ValueError(
                    f"launched as rank {launched[0]} of {launched[1]}, but parallel.tensor_parallel_size={n}"
                )
            init_default(0, n, "env://", JOIN_TIMEOUT_S)
        else:
            method = f"tcp://127.0.0.1:{_free_port()}"
            ctx = mp.get_context("spawn")
            for rank in range(1, n):
                p = ctx.Process(target=run_worker, args=(rank, n, method, SPAWN_JOIN_TIMEOUT_S), daemon=True)
                p.start()
                self.procs.append(p)
            # the processes are killed when this object goes or the interpreter exits, whatever happened
            self._finalizer = weakref.finalize(self, _stop, self.procs, None)
            init_default(0, n, method, SPAWN_JOIN_TIMEOUT_S)
        torch.distributed.broadcast_object_list([plan], src=0)
        self.group = make_group(0, n, plan.device_type, config.parallel.timeout_s)
        if launched is not None:  # torchrun's workers wait for "stop": send it when this goes or at exit
            self._finalizer = weakref.finalize(self, _stop, [], self.group)
        self.timeout_s = config.parallel.timeout_s

    def build_model(self, spec, ops, dtype, device, seed: int):
        """Rank 0's shard of the model, loaded alone (the workers load theirs meanwhile); then every worker's
        build report (a traceback if its build failed) is collected."""
        model = build_rank_model(spec, ops, dtype, device, seed, self.group)
        failed = [r for r in self.group.gather_objects(None) if r is not None]
        if failed:
            self.close(stop=False)
            raise TensorParallelError("\n".join(failed))
        return model

    def executor(self, runner) -> "TPExecutor":
        return TPExecutor(runner, self)

    def dead_workers(self, wait_s: float = 0.0) -> list[str]:
        """'rank r exited with code c' for each worker gone; wait_s: first wait that long for one to go (a
        collective can fail on a peer's closed socket before its process is reaped)."""
        if wait_s and self.procs:
            deadline = time.monotonic() + wait_s
            ready = multiprocessing.connection.wait([p.sentinel for p in self.procs], timeout=wait_s)
            # a sentinel is ready when the process closes its files, a moment before it can be reaped
            closing = [p for p in self.procs if p.sentinel in ready]
            while any(p.exitcode is None for p in closing) and time.monotonic() < deadline:
                time.sleep(0.02)
        return [
            f"rank {i + 1} exited with code {p.exitcode}" for i, p in enumerate(self.procs) if p.exitcode is not None
        ]

    def close(self, stop: bool = True) -> None:
        """Workers stopped (asked, or killed when `stop` is False or they do not end) and the group destroyed."""
        self._finalizer.detach()
        _stop(self.procs, self.group if stop else None)


class TPExecutor(StepExecutor):
    """The engine's executor under TP: each step goes to the workers, then through rank 0's ModelRunner (its
    forward's all-reduces and logits gathers meet the workers')."""

    def __init__(self, runner, tp: TensorParallel):
        self.runner, self.tp = runner, tp
        self.model = runner.model
        self.broken: str | None = None

    def prepare(self, out):
        self._check()
        try:
            return worker_step(out), self.runner.prepare(out)
        except Exception as e:  # rank 0's block tables may have moved without the workers'
            self.broken = f"tensor-parallel step preparation failed on rank 0 ({type(e).__name__}: {e})"
            raise TensorParallelError(self.broken) from e

    def run(self, prepared, last_tokens: dict[str, int]) -> ExecutorOutput:
        self._check()
        message, local = prepared
        try:
            self.tp.group.send(("step", message, dict(last_tokens)))
            return self.runner.run(local, last_tokens)
        except Exception as e:
            # a killed worker's sockets can close before it can be reaped (longer on a loaded machine)
            dead = self.tp.dead_workers(wait_s=min(10.0, self.tp.timeout_s))
            why = (
                "; ".join(dead)
                if dead
                else f"a collective failed or did not finish within {self.tp.timeout_s:g} s (parallel.timeout_s)"
            )
            self.broken = f"tensor-parallel group failed: {why} ({type(e).__name__}: {e})"
            raise TensorParallelError(self.broken) from e

    def _check(self) -> None:
        if self.broken is None and self.tp.procs:
            dead = self.tp.dead_workers()
            if dead:
                self.broken = f"tensor-parallel group failed: {'; '.join(dead)}"
        if self.broken is not None:
            raise TensorParallelError(self.broken)

    def close(self) -> None:
        self.tp.close(stop=self.broken is None)
