"""Real replicas: N engines, one process each (torch.multiprocessing, spawn), each its own model copy,
and the router in this process. The replica-set interface of experiments.replay.driver, on the monotonic
clock (CLOCK_MONOTONIC is one clock for every process of a machine, so the replicas' timestamps and the
driver's arrival times compare directly).

Messages: to a replica, ("add", request id, prompt ids, params, arrival time, priority), ("abort",) and
("stop",); from a replica, ("ready", i, info), ("finished", i, fields), ("load", i, running, waiting, free
blocks) after every step, ("failed", i, request id, message), ("aborted", i) and ("steps", i, rows).
A router sees each replica's load as of its last step and the router's own outstanding count; a replica's
prefix cache it cannot read, so `is_cached` answers from the prompts it routed there (RoutedPrefixes).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import time
from types import SimpleNamespace

from testbed.cluster.build import replica_config
from testbed.cluster.config import ClusterConfig
from testbed.cluster.prefix import RoutedPrefixes, leading_block_hashes
from testbed.cluster.routers import RouteRequest, get_router
from testbed.cluster.simulated import Delivered
from testbed.outputs import CompletionOutput, RequestMetrics, RequestOutput

STARTUP_TIMEOUT_S = 900.0  # model load and, the first time, the built-in model's conversion


@dataclasses.dataclass
class ProcessReplicaView:
    index: int
    total_blocks: int
    prefixes: RoutedPrefixes
    outstanding: int = 0
    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    healthy: bool = True

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self.prefixes


def _fields(out: RequestOutput) -> tuple:
    m, c = out.metrics, out.outputs[0]
    if m is None:  # an engine's finished output carries its request's metrics
        raise RuntimeError(f"finished request {out.request_id!r} has no metrics")
    return (
        out.request_id,
        list(c.token_ids),
        c.finish_reason or "abort",
        m.arrival_time,
        m.first_scheduled_time,
        m.first_token_time,
        m.finish_time,
        list(m.token_times),
        int(m.num_cached_tokens),
        int(m.num_preemptions),
    )


def _output(fields: tuple) -> RequestOutput:
    rid, tokens, reason, arrival, scheduled, first, finish, times, cached, preemptions = fields
    metrics = RequestMetrics(arrival, scheduled, first, finish, times, cached, preemptions)
    return RequestOutput(rid, [], [CompletionOutput(0, "", tokens, None, reason)], True, metrics=metrics)


def replica_main(index: int, config, threads: int, inbox, results) -> None:
    """A replica process: build the engine, then add, step and report until told to stop."""
    import signal

    import torch

    from experiments.results.recorder import Recorder
    from testbed import Engine

    # the driver owns stopping (Ctrl-C and scancel reach the whole process group): it aborts, collects
    # and stops its replicas by message, and they die with it (daemon processes)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    torch.set_num_threads(threads)
    engine = Engine(config)
    recorder = Recorder().attach(engine)
    kv = engine.kv
    info = {
        "num_blocks": kv.num_blocks,
        "block_size": kv.block_size,
        "kernel": engine.kernel,
        "device": str(engine.device),
    }
    results.put(("ready", index, info))
    while True:
        messages = []
        try:
            messages.append(inbox.get(timeout=0.05) if not engine.has_unfinished() else inbox.get_nowait())
            while True:
                messages.append(inbox.get_nowait())
        except queue.Empty:
            pass
        for message in messages:
            kind = message[0]
            if kind == "add":
                _, rid, prompt, params, arrival, priority = message
                try:
                    engine.add_request(rid, prompt, params, arrival, priority)
                except ValueError as e:
                    results.put(("failed", index, rid, str(e)))
            elif kind == "abort":
                for rid in list(engine.scheduler.requests):
                    out = engine.abort(rid)
                    if out is not None:
                        results.put(("finished", index, _fields(out)))
                results.put(("aborted", index))
            elif kind == "stop":
                results.put(("steps", index, recorder.steps))
                return
        if engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    results.put(("finished", index, _fields(out)))
            s = engine.scheduler
            results.put(("load", index, s.num_running, s.num_waiting, kv.num_free_blocks))


class ProcessCluster:
    def __init__(self, engine_config, cluster: ClusterConfig):
        import torch.multiprocessing as mp

        from testbed.models.build import load_model_spec_from

        self.model = load_model_spec_from(engine_config.model)
        # what the console summary reads from an engine
        self.description = SimpleNamespace(
            config=engine_config, model_name=self.model.name, device=engine_config.executor.device or "auto"
        )
        self.block_size = engine_config.cache.block_size
        n = cluster.num_replicas
        self.threads = cluster.threads_per_replica or max(1, (os.cpu_count() or 1) // n)
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.processes = [
            ctx.Process(
                target=replica_main,
                args=(i, replica_config(engine_config, i), self.threads, self.inboxes[i], self.results),
                name=f"replica-{i}",
                daemon=True,
            )
            for i in range(n)
        ]
        for p in self.processes:
            p.start()
        self.router = get_router(cluster.router, seed=engine_config.seed, **cluster.router_options)
        self.roles = ["mixed"] * n
        self.views: list[ProcessReplicaView] = []
        self.failed: dict[str, str] = {}  # request id -> why its replica refused it
        self._pending: list[Delivered] = []
        self._steps: dict[int, list] = {}
        self._acks: set[int] = set()
        ready: dict[int, dict] = {}
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(ready) < n:
            try:
                message = self._receive(deadline)
            except RuntimeError:
                self.close()
                raise
            if message is None and self.now >= deadline:
                self.close()
                raise RuntimeError(f"replica processes did not start within {STARTUP_TIMEOUT_S:.0f} s")
            if message is not None and message[0] == "ready":
                ready[message[1]] = message[2]
        # the kernel and device the replicas resolved (kernel=auto), for the summary
        self.description.kernel, self.description.device = ready[0]["kernel"], ready[0]["device"]
        for i in range(n):
            blocks = ready[i]["num_blocks"]
            self.views.append(ProcessReplicaView(i, blocks, RoutedPrefixes(blocks), free_blocks=blocks))

    # ---- the cluster interface -------------------------------------------------------------------
    @property
    def now(self) -> float:
        return time.monotonic()

    def validate(self, prompt_token_ids, params, request_id) -> None:
        """What can be checked here; a replica refusing a request later reports it (a failed row)."""
        n, limit = len(prompt_token_ids), self.model.max_model_len
        if n == 0 or n >= limit:
            raise ValueError(f"request {request_id}: a prompt of {n} tokens does not fit max_model_len={limit}")
        final = min(n + (params.max_tokens or limit), limit)
        need = -(-final // self.block_size)
        smallest = min(v.total_blocks for v in self.views)
        if need > smallest:
            raise ValueError(f"request {request_id}: {final} tokens need {need} KV blocks, a replica has {smallest}")

    def submit(self, request_id, prompt_token_ids, params, arrival_time=None, priority=0) -> int:
        hashes = leading_block_hashes(prompt_token_ids, self.block_size)
        index = self.router.route(RouteRequest(request_id, len(prompt_token_ids), hashes), self.views)
        view = self.views[index]
        view.outstanding += 1
        view.prefixes.add(hashes)
        arrival = self.now if arrival_time is None else arrival_time
        self.inboxes[index].put(("add", request_id, list(prompt_token_ids), params, arrival, priority))
        return index

    def plan_arrivals(self, arrivals, until: float = float("inf")) -> bool:
        """Nothing to plan: real replicas run in real time, each request routed when it is sent."""
        return False

    def run_until(self, t: float, quiet_until: float | None = None) -> list[Delivered]:
        """Take what the replicas report until some requests finish or `t` comes (quiet_until: unused,
        real replicas step one by one)."""
        while not self._pending:
            message = self._receive(min(t, self.now + 1.0))
            if message is None and self.now >= t:
                break
        out, self._pending = self._pending, []
        return out

    def has_unfinished(self) -> bool:
        return bool(self._pending) or any(v.outstanding for v in self.views)

    def abort_all(self) -> list[Delivered]:
        self._acks = set()
        for inbox in self.inboxes:
            inbox.put(("abort",))
        deadline = self.now + 60
        while len(self._acks) < len(self._alive()) and self.now < deadline:
            self._receive(deadline, tolerate_dead=True)
        out, self._pending = self._pending, []
        return out

    def collect_steps(self) -> dict[int, list]:
        """Stop the replicas; their step rows, by replica."""
        for inbox in self.inboxes:
            inbox.put(("stop",))
        deadline = self.now + 120
        while len(self._steps) < len(self._alive()) and self.now < deadline:
            self._receive(deadline, tolerate_dead=True)
        return self._steps

    def close(self) -> None:
        """Stop every replica process (those not stopped by collect_steps: after an error)."""
        for i, p in enumerate(self.processes):
            if p.is_alive() and i not in self._steps:
                self.inboxes[i].put(("stop",))
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)

    def identity(self) -> dict:
        return {"cluster_mode": "processes", "cluster_router": self.router.name, "threads_per_replica": self.threads}

    # ---- messages ---------------------------------------------------------------------------------
    def _alive(self) -> list[int]:
        return [i for i, p in enumerate(self.processes) if p.is_alive()]

    def _receive(self, deadline: float, tolerate_dead: bool = False):
        """One message from any replica (None if none came by the deadline); a dead replica is an error
        (unless shutting down, when the others' messages are still taken)."""
        try:
            message = self.results.get(timeout=max(0.0, min(deadline - self.now, 0.5)))
        except queue.Empty:
            dead = [p.name for p in self.processes if not p.is_alive() and p.exitcode not in (0, None)]
            if dead and not tolerate_dead:
                raise RuntimeError(f"replica process died: {', '.join(dead)}") from None
            return None
        kind, index = message[0], message[1]
        if kind == "finished":
            self.views[index].outstanding -= 1
            self._pending.append(Delivered(index, _output(message[2])))
        elif kind == "load":
            view = self.views[index]
            view.running, view.waiting, view.free_blocks = message[2], message[3], message[4]
        elif kind == "failed":
            self.views[index].outstanding -= 1
            raise ValueError(f"replica {index} refused request {message[2]}: {message[3]}")
        elif kind == "aborted":
            self._acks.add(index)
        elif kind == "steps":
            self._steps[index] = message[2]
        return message
