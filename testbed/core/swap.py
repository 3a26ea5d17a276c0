"""Swap preemption (`preemption_mode=swap`): a preempted request's KV blocks go to a host (CPU) pool
and come back into fresh device blocks when it resumes, instead of being recomputed.

The manager only books host blocks and logs the copies with the allocator (`record_copy`, in the order
made, among the allocator's own copy-on-write copies); the scheduler hands them to the executor in its next
non-empty SchedulerOutput (`kv_copies`), which runs them before that step's forward. That is early enough:
the device blocks a swap-out frees are written by their next owner only in a forward (or by a later copy,
which runs after it), and a resumed request's blocks are read only in one. A request that
does not fit in the host pool falls back to recompute.
"""

from testbed.core.allocators.base import CopyKind
from testbed.request import Request


class SwapManager:
    def __init__(self, kv, num_cpu_blocks: int):
        if num_cpu_blocks < 1:
            raise ValueError(f"swap needs at least one host block, got num_cpu_blocks={num_cpu_blocks}")
        self.kv = kv
        self.num_cpu_blocks = num_cpu_blocks
        self.free_ids = list(range(num_cpu_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.swapped: dict[str, list[int]] = {}  # request id -> host block ids
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.blocks_swapped = 0  # out + in, in blocks

    def holds(self, request: Request) -> bool:
        return request.request_id in self.swapped

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def swap_out(self, request: Request) -> bool:
        """Book host blocks for the request's computed KV, record the copy and free its device blocks.
        False (nothing done) if it has no computed KV or the host pool is short: the caller recomputes."""
        n = self.kv.blocks_needed(request.num_computed_tokens)
        if n == 0 or n > len(self.free_ids):
            return False
        device_ids = self.kv.get_block_ids(request.request_id)[:n]
        host_ids = [self.free_ids.pop() for _ in range(n)]
        self.kv.record_copy(device_ids, host_ids, CopyKind.TO_HOST)
        self.kv.free(request)
        self.swapped[request.request_id] = host_ids
        self.num_swap_outs += 1
        self.blocks_swapped += n
        return True

    def swap_in(self, request: Request) -> None:
        """After the allocator gave the request device blocks again: record the copy back, free the host blocks."""
        host_ids = self.swapped.pop(request.request_id)
        device_ids = self.kv.get_block_ids(request.request_id)[: len(host_ids)]
        self.kv.record_copy(host_ids, device_ids, CopyKind.TO_DEVICE)
        self.free_ids.extend(reversed(host_ids))
        self.num_swap_ins += 1
        self.blocks_swapped += len(host_ids)

    def discard(self, request: Request) -> None:
        """A swapped-out request ended (abort): drop its host copy."""
        host_ids = self.swapped.pop(request.request_id, None)
        if host_ids:
            self.free_ids.extend(reversed(host_ids))
