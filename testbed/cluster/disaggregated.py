"""Disaggregated prefill/decode on the simulated cluster (DistServe, OSDI'24; Splitwise, ISCA'24; vLLM's
P/D with its NixlConnector): a request is prefilled on a prefill replica, its KV blocks move over a link
to a decode replica, and it is decoded there.

    arrival        the router picks a prefill replica; the request runs there with max_tokens=1 (vLLM's
                   P/D proxy does the same); that token is dropped
    prefill ends   its leading full blocks stay held on the prefill replica (they are the transfer's
                   source) and a decode replica is chosen (decode_router); the transfer queues there
    transfer       starts when the decode replica's link is free and it has room: the blocks it lacks,
                   plus the rest of the prompt and the first token (the "tail"), counting room already
                   promised to earlier transfers; otherwise the request waits (back-pressure, in order).
                   The blocks are allocated when it starts; it takes bytes / bandwidth + latency, bytes =
                   blocks it lacks * block_size * the model's KV bytes per token
    transfer ends  the prefill replica's blocks are freed; the moved blocks join the decode replica's prefix
                   cache (held until the request is admitted) and the request is added to its engine, which
                   finds them as a prefix hit, computes the rest of the prompt and samples the first token
                   (so TTFT includes the prefill, the wait, the transfer and that step)

Moved: the (prompt - 1) // block_size leading full blocks, less those the decode replica has cached (as
vLLM's NixlConnector: only full blocks move and the local prefix-cache hit is subtracted); the decode
replica recomputes the last partial block. Each decode replica's link carries one transfer at a time, in
order; the prefill side's link is not modelled. A prefill replica whose memory is all held by transfers
waiting on full decode replicas stops admitting: back-pressure reaches the prefill side, as in DistServe.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from testbed.cluster.links import LinkSpec
from testbed.cluster.replica import SimReplica
from testbed.cluster.routers import Router
from testbed.cluster.simulated import TRANSFER_DONE, Delivered, SimulatedCluster
from testbed.cluster.transfer import KVTransfer
from testbed.outputs import RequestOutput
from testbed.request import Request
from testbed.sampling_params import SamplingParams


@dataclasses.dataclass
class DisaggregatedDelivered(Delivered):
    handoff: KVTransfer | None = None


class DisaggregatedCluster(SimulatedCluster):
    independent_replicas = False  # prefill replicas hand requests to decode replicas

    def __init__(self, prefill_engines, decode_engines, router: Router, decode_router: Router, link: LinkSpec):
        if not prefill_engines or not decode_engines:
            raise ValueError("P/D disaggregation needs at least one prefill and one decode replica")
        engines = [*prefill_engines, *decode_engines]
        roles = ["prefill"] * len(prefill_engines) + ["decode"] * len(decode_engines)
        super().__init__(engines, router, roles)
        for engine in engines:
            if engine.kv.pool is None or not engine.kv.enable_prefix_caching:
                raise ValueError(
                    "P/D disaggregation hands KV over through the decode replica's prefix cache: it needs "
                    "cache=paged with prefix caching on"
                )
        self.prefill = self.replicas[: len(prefill_engines)]
        self.decode = self.replicas[len(prefill_engines) :]
        self.decode_router = decode_router
        self.link = link
        first = engines[0]
        self.kv_bytes_per_token = first.arch.kv_bytes_per_token(first.dtype.itemsize)
        # request id -> (prompt, params, arrival time, priority, prefill-side Request)
        self.requests: dict[str, tuple[list[int], SamplingParams, float, int, Request]] = {}
        self.transfers: dict[str, KVTransfer] = {}  # from prefill end until the request finishes on decode
        # transfers waiting for room or the link
        self.queue: dict[int, deque[KVTransfer]] = {r.index: deque() for r in self.decode}
        self.link_free_at = {r.index: 0.0 for r in self.decode}
        self.reserved_tail = {r.index: 0 for r in self.decode}  # room promised to transfers not yet admitted
        # transfers done whose request the decode replica has not admitted yet, with that request
        self.awaiting_admission: dict[int, list[tuple[KVTransfer, Request]]] = {r.index: [] for r in self.decode}
        self.held = {r.index: 0 for r in self.prefill}  # blocks held for transfers, per prefill replica

    # ---- arrivals: the prefill replicas ---------------------------------------------------------------
    def entry_replicas(self) -> list[SimReplica]:
        return self.prefill

    @staticmethod
    def prefill_params(params: SamplingParams) -> SamplingParams:
        return dataclasses.replace(params, max_tokens=1, min_tokens=0)

    def validate(self, prompt_token_ids, params, request_id) -> None:
        self.prefill[0].engine.validate(prompt_token_ids, self.prefill_params(params), request_id)
        self.decode[0].engine.validate(prompt_token_ids, params, request_id)

    def submit(self, request_id, prompt_token_ids, params, arrival_time=None, priority=0) -> int:
        index = self.route(request_id, prompt_token_ids, self.prefill, self.router)
        arrival = self.now if arrival_time is None else arrival_time
        request = self._add(
            self.replicas[index], request_id, prompt_token_ids, self.prefill_params(params), arrival, priority
        )
        self.requests[request_id] = (prompt_token_ids, params, arrival, priority, request)
        self.replica_of[request_id] = index
        return index

    # ---- deliveries: a prefill's end starts a handoff; a decode's end is the request's end ------------
    def _deliver(self, replica: SimReplica, outputs: list[RequestOutput]) -> list[Delivered]:
        delivered: list[Delivered] = []
        for out in outputs:
            replica.outstanding -= 1
            if replica.role == "prefill" and out.outputs[0].finish_reason != "abort":
                self._handoff(replica, out)
                continue
            self.requests.pop(out.request_id, None)
            delivered.append(DisaggregatedDelivered(replica.index, out, self.transfers.pop(out.request_id, None)))
        return delivered

    def _handoff(self, replica: SimReplica, out: RequestOutput) -> None:
        prompt, params, arrival, priority, request = self.requests[out.request_id]
        pool = replica.engine.kv.pool
        hashes = request.block_hashes[: (len(prompt) - 1) // self.block_size]
        blocks = []
        for block_hash in hashes:  # the request just freed them: they are in the prefix cache
            block = pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        pool.touch(blocks)
        self.held[replica.index] += len(blocks)
        moved = len(blocks)
        decode = self.replicas[self.route(out.request_id, prompt, self.decode, self.decode_router)]
        transfer = KVTransfer(
            out.request_id,
            prompt,
            params,
            arrival,
            priority,
            replica,
            out,
            self.now,
            hashes[:moved],
            decode,
            blocks,
            tail_blocks=-(-(len(prompt) + 1) // self.block_size) - moved,
        )
        decode.outstanding += 1  # the decode router counts queued transfers as that replica's load
        decode.num_routed += 1
        self.transfers[out.request_id] = transfer
        self.queue[decode.index].append(transfer)
        self._start_transfers(decode)

    # ---- transfers --------------------------------------------------------------------------------
    def _start_transfers(self, decode: SimReplica) -> None:
        queue, pool = self.queue[decode.index], decode.engine.kv.pool
        while queue and self.link_free_at[decode.index] <= self.now:
            transfer = queue[0]
            cached = [pool.get_cached_block(h) for h in transfer.block_hashes]
            revived = sum(1 for b in cached if b is not None and b.ref_cnt == 0)
            missing = sum(1 for b in cached if b is None)
            room = pool.num_free_blocks - self.reserved_tail[decode.index]
            if missing + revived + transfer.tail_blocks > room:
                return  # back-pressure: it waits for room, and those behind it wait too
            queue.popleft()
            hits = [b for b in cached if b is not None]
            pool.touch(hits)
            new = iter(pool.get_new_blocks(missing))
            transfer.decode_blocks = [
                (h, b, False) if b is not None else (h, next(new), True) for h, b in zip(transfer.block_hashes, cached)
            ]
            self.reserved_tail[decode.index] += transfer.tail_blocks
            transfer.num_bytes = missing * self.block_size * self.kv_bytes_per_token
            transfer.start_time = self.now
            transfer.end_time = self.now + self.link.transfer_time(transfer.num_bytes)
            self.link_free_at[decode.index] = transfer.end_time
            self._push(transfer.end_time, TRANSFER_DONE, transfer)

    def _transfer_done(self, transfer: KVTransfer) -> list[Delivered]:
        prefill, decode = transfer.prefill, transfer.decode
        prefill.engine.kv.pool.free_blocks(transfer.prefill_blocks)
        self.held[prefill.index] -= len(transfer.prefill_blocks)
        transfer.prefill_blocks = []
        self._wake(prefill)  # it may have been out of room
        pool = decode.engine.kv.pool
        for i, (block_hash, block, sent) in enumerate(transfer.decode_blocks):
            if not sent:
                continue
            existing = pool.get_cached_block(block_hash)
            if existing is None:
                pool.cache_block(block, block_hash)
            elif existing is not block:  # the same prefix landed meanwhile: keep that copy, drop this one
                pool.touch([existing])
                pool.free_blocks([block])
                transfer.decode_blocks[i] = (block_hash, existing, sent)
        decode.sync(self.now)
        request = transfer.decode_request = decode.engine.add_request(
            transfer.request_id, transfer.prompt_token_ids, transfer.params, transfer.arrival_time, transfer.priority
        )
        self.awaiting_admission[decode.index].append((transfer, request))
        self._wake(decode)
        self._start_transfers(decode)
        return []

    def _step_end(self, replica: SimReplica) -> list[Delivered]:
        if replica.role == "decode":  # requests admitted by the step that ended: their blocks are theirs now
            waiting = self.awaiting_admission[replica.index]
            admitted = [t for t in waiting if t[1].first_scheduled_time is not None]
            if admitted:
                pool = replica.engine.kv.pool
                for transfer, _ in admitted:
                    pool.free_blocks([b for _, b, _ in transfer.decode_blocks])
                    self.reserved_tail[replica.index] -= transfer.tail_blocks
                self.awaiting_admission[replica.index] = [t for t in waiting if t not in admitted]
        delivered = super()._step_end(replica)
        if replica.role == "decode":
            self._start_transfers(replica)  # the step may have freed room
        return delivered

    def _engine_step(self, replica: SimReplica) -> list[RequestOutput]:
        try:
            return replica.engine.step()
        except RuntimeError:
            # the engine refuses an empty step with nothing running ("stalled"); here that is back-pressure:
            # transfers hold its memory, and their ends wake it
            if replica.role == "prefill" and self.held[replica.index] and not replica.engine.scheduler.num_running:
                return []
            raise

    # ---- state -------------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return super().has_unfinished() or any(self.queue.values())

    def _check_not_stuck(self) -> None:
        queued = {i: len(q) for i, q in self.queue.items() if q}
        if queued:
            raise RuntimeError(f"simulated cluster stuck: KV transfers {queued} wait for room no step will free")
        super()._check_not_stuck()

    def abort_all(self) -> list[Delivered]:
        out = super().abort_all()
        for transfer in list(self.transfers.values()):  # prefilled, not yet in a decode engine: abort there
            if transfer.decode_request is None:
                engine = transfer.decode.engine
                engine.add_request(
                    transfer.request_id, transfer.prompt_token_ids, transfer.params, transfer.arrival_time
                )
                aborted = engine.abort(transfer.request_id)
                out += self._deliver(transfer.decode, [aborted])
        for queue in self.queue.values():
            queue.clear()
        return out

    def identity(self) -> dict:
        return {
            "cluster_mode": "simulated",
            "cluster_router": self.router.name,
            "cluster_decode_router": self.decode_router.name,
            "cluster_prefill_replicas": len(self.prefill),
            "cluster_decode_replicas": len(self.decode),
            "cluster_link": self.link.name,
            "cluster_link_bandwidth_gbs": self.link.bandwidth_gbs,
            "cluster_link_latency_us": self.link.latency_us,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }
