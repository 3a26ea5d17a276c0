"""CUDA graphs for decode steps: one graph per captured batch size, a batch padded to the next size.

A decode step (one new token per request) runs the same kernels every time; only the data changes. The
graph for batch size B was captured reading the engine's static device input buffers
(testbed.executor.host_buffers.InputBuffers) rows [0, B), so a step copies its inputs there, pads the
rows past its batch (slot -1: no KV write; length 0: attends to nothing) and replays the graph. What
makes the forward capturable: no host-device synchronisation and no host value that changes per step.
The Triton backend qualifies: its decode launch gets `max_seq_len = max_model_len` (a bound; the
split-KV chunks are sized per sequence inside the kernel) and its split count depends on the batch size
only. The torch reference backend does not (boolean indexing and .tolist() sync), so it stays eager.

Logits and sampling run eagerly on the graph's output rows. `capture=False` runs the same padded,
static-buffer path eagerly: the CPU tests use it to check the padding logic without a GPU.
"""

import bisect
import logging
import time

import torch

from testbed.attention.backend import AttentionMetadata

logger = logging.getLogger(__name__)

GRAPH_SAFE_BACKENDS = ("triton",)


def default_capture_sizes(max_num_seqs: int, limit: int = 512) -> list[int]:
    """1, 2, 4, 8, 16, 24, ... (steps of 8) up to max_num_seqs (included), at most `limit`."""
    top = max(1, min(max_num_seqs, limit))
    sizes = [s for s in [1, 2, 4, *range(8, limit + 1, 8)] if s < top]
    return sizes + [top]


def padded_batch_size(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= num_seqs (sizes sorted), or None if the batch is too large."""
    i = bisect.bisect_left(sizes, num_seqs)
    return sizes[i] if i < len(sizes) else None


def use_cuda_graphs(enforce_eager: bool, backend, device) -> bool:
    """Whether decode steps replay graphs: CUDA, not enforce_eager, graph-safe kernels."""
    if enforce_eager or torch.device(device).type != "cuda":
        return False
    if backend.name not in GRAPH_SAFE_BACKENDS:
        logger.info("kernel=%s is not CUDA-graph safe: decode runs eagerly", backend.name)
        return False
    return True


class CudaGraphRunner:
    def __init__(self, model, kv_caches, buffers, sizes: list[int], max_seq_len: int, capture: bool = True):
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.sizes = sorted(set(sizes))
        if not buffers.static:
            raise ValueError("CUDA graphs need InputBuffers with static device tensors")
        if self.sizes[-1] > buffers.max_seqs or self.sizes[-1] > buffers.max_tokens:
            raise ValueError(
                f"captured size {self.sizes[-1]} exceeds the input buffers "
                f"({buffers.max_seqs} seqs, {buffers.max_tokens} tokens)"
            )
        self.max_seq_len = max_seq_len
        self.use_graphs = capture
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.generation = buffers.generation
        self.capture_seconds = 0.0
        self.replays = 0

    # ---- per step ---------------------------------------------------------------------------------
    def padded_size(self, out) -> int | None:
        """Captured size for this step, or None to run it eagerly (not pure decode, too big, buffers moved)."""
        n = len(out.requests)
        if n == 0 or sum(out.num_new_tokens) != n or self.buffers.generation != self.generation:
            return None
        return padded_batch_size(n, self.sizes)

    def replay(self, padded: int, num_seqs: int) -> torch.Tensor | None:
        """Hidden states of the real rows (the inputs are already in the static buffers), or None if the
        buffers were reallocated since capture (then the step runs eagerly)."""
        if self.buffers.generation != self.generation:
            return None
        self.replays += 1
        if not self.use_graphs:
            return self._forward(padded)[:num_seqs]
        self.graphs[padded].replay()
        return self.outputs[padded][:num_seqs]

    # ---- capture ----------------------------------------------------------------------------------
    def _meta(self, bs: int) -> AttentionMetadata:
        dev = self.buffers.dev
        return AttentionMetadata(
            slot_mapping=dev["slot_mapping"][:bs],
            query_start_loc=dev["query_start_loc"][: bs + 1],
            seq_lens=dev["seq_lens"][:bs],
            block_tables=dev["block_tables"][:bs],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        dev = self.buffers.dev
        return self.model(dev["input_ids"][:bs], dev["positions"][:bs], self.kv_caches, self._meta(bs))

    @torch.inference_mode()
    def capture(self) -> "CudaGraphRunner":
        """Capture every size, largest first, sharing one memory pool. No-op when capture=False."""
        if not self.use_graphs:
            return self
        start = time.perf_counter()
        dev = self.buffers.dev
        # inert inputs: nothing written to the cache, nothing attended
        dev["input_ids"].zero_()
        dev["positions"].zero_()
        dev["slot_mapping"].fill_(-1)
        dev["seq_lens"].zero_()
        dev["query_start_loc"].zero_()
        dev["block_tables"].zero_()
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):
            # warm up on a side stream: compiles the Triton kernels and sets up cuBLAS outside the capture
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(bs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.outputs[bs] = self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        logger.info(
            "captured %d decode CUDA graphs (batch %d..%d) in %.1f s",
            len(self.sizes),
            self.sizes[0],
            self.sizes[-1],
            self.capture_seconds,
        )
        return self
