"""Host-side staging for a step's inputs: pinned buffers, static device buffers.

`InputBuffers` owns, per input field, a host array the step is written into and a device tensor the
model reads. Host arrays come in two sets used in turn (a step is staged while the one before may still
read its set: async scheduling); on CUDA they are pinned (guarded by an event) and copied with
`non_blocking=True`, so building inputs never waits for the GPU; the device tensors have fixed
addresses, which is what CUDA graphs capture (testbed.executor.cuda_graphs). On CPU the host arrays
are the model's inputs (no copy), unless `static=True` asks for the same fixed "device" tensors there
(to test the graph path's padding without a GPU). Tensors handed out are valid until the next step.
"""

import numpy as np
import torch

# field -> (dtype, sized by "tokens" | "seqs" | "seqs+1")
FIELDS = {
    "input_ids": (np.int64, "tokens"),
    "positions": (np.int64, "tokens"),
    "slot_mapping": (np.int64, "tokens"),
    "logits_indices": (np.int64, "tokens"),
    "query_start_loc": (np.int32, "seqs+1"),
    "seq_lens": (np.int32, "seqs"),
}
_TORCH = {np.int64: torch.int64, np.int32: torch.int32}


class InputBuffers:
    """Fixed-capacity staging for one step's inputs (see the module docstring)."""

    def __init__(
        self,
        block_size: int,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        device,
        static: bool | None = None,
    ):
        self.block_size = block_size
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.static = self.cuda if static is None else static  # fixed device tensors, copied into
        self.generation = 0  # bumped whenever the device tensors move (captured graphs must notice)
        self._allocate(max_tokens, max_seqs, max_blocks_per_seq)

    def _allocate(self, tokens: int, seqs: int, width: int) -> None:
        self.max_tokens, self.max_seqs, self.max_width = tokens, seqs, width
        sizes = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        num_sets = 2  # used in turn: a step is staged while the one before may still read (or copy) its set

        def host(size, dtype):
            t = torch.zeros(size, dtype=_TORCH[dtype], pin_memory=self.cuda)
            return t, t.numpy()

        self._host = []  # per set: field -> (tensor, numpy view); "block_tables" flat
        for _ in range(num_sets):
            bufs = {name: host(sizes[kind], dtype) for name, (dtype, kind) in FIELDS.items()}
            bufs["block_tables"] = host(seqs * width, np.int32)
            self._host.append(bufs)
        self._events: list[torch.cuda.Event | None] = [None] * num_sets
        self._set = 0
        self._views: dict[tuple, dict] = {}  # sizes -> the slices handed out (see _cached)
        # per set: (rows, width, version) of the block-table rows it holds, or None (testbed.executor.inputs)
        self.staged_tables: list[tuple | None] = [None] * num_sets
        if self.static:
            self.dev = {
                name: torch.zeros(sizes[kind], dtype=_TORCH[dtype], device=self.device)
                for name, (dtype, kind) in FIELDS.items()
            }
            self.dev["block_tables"] = torch.zeros(seqs, width, dtype=torch.int32, device=self.device)
        self.generation += 1

    def ensure(self, tokens: int, seqs: int, width: int) -> None:
        """Grow (reallocating, which invalidates captured graphs) if a step does not fit."""
        if tokens > self.max_tokens or seqs > self.max_seqs or width > self.max_width:
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()
            self._allocate(max(tokens, self.max_tokens), max(seqs, self.max_seqs), max(width, self.max_width))

    def next_set(self) -> int:
        """The buffer set the next step is staged in (its last copies have finished)."""
        self._set = (self._set + 1) % len(self._host)
        event = self._events[self._set]
        if event is not None and not event.query():
            event.synchronize()  # copies issued two steps ago: done unless the GPU is far behind
        return self._set

    def host_arrays(self, index: int, tokens: int, seqs: int, width: int) -> dict[str, np.ndarray]:
        """Writable host arrays of set `index` (from next_set)."""
        return self._cached(("host", index, tokens, seqs, width), self._host_views, index, tokens, seqs, width)

    def _cached(self, key: tuple, make, *sizes) -> dict:
        """The slices of the buffers for these sizes, made once: slicing a tensor costs microseconds and
        steady decoding asks for the same sizes every step. The dicts are shared: read them, never
        change them (the buffers behind them are rewritten every step anyway)."""
        views = self._views.get(key)
        if views is None:
            if len(self._views) > 256:  # prefill steps come in many sizes: keep the cache small
                self._views.clear()
            views = self._views[key] = make(*sizes)
        return views

    def _host_views(self, index: int, tokens: int, seqs: int, width: int) -> dict[str, np.ndarray]:
        bufs = self._host[index]
        sizes = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        out = {name: bufs[name][1][: sizes[kind]] for name, (_, kind) in FIELDS.items()}
        out["block_tables"] = bufs["block_tables"][1][: seqs * width].reshape(seqs, width)
        return out

    def _lengths(self, tokens: int, seqs: int, num_logits: int) -> dict[str, int]:
        lengths = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        lengths = {name: lengths[kind] for name, (_, kind) in FIELDS.items()}
        lengths["logits_indices"] = num_logits
        return lengths

    def _tensor_views(self, index: int, tokens: int, seqs: int, width: int, num_logits: int) -> dict:
        """Host tensors of these sizes (what the model reads when there are no static device buffers)."""
        bufs = self._host[index]
        out = {name: bufs[name][0][:n] for name, n in self._lengths(tokens, seqs, num_logits).items()}
        out["block_tables"] = bufs["block_tables"][0][: seqs * width].view(seqs, width)
        return out

    def _device_views(self, tokens: int, seqs: int, width: int, num_logits: int) -> dict[str, torch.Tensor]:
        out = {name: self.dev[name][:n] for name, n in self._lengths(tokens, seqs, num_logits).items()}
        out["block_tables"] = self.dev["block_tables"][:seqs, :width]
        return out

    def to_device(self, index: int, tokens: int, seqs: int, width: int, num_logits: int) -> dict[str, torch.Tensor]:
        """Device tensors holding what set `index`'s host arrays received (asynchronous copies on CUDA)."""
        sizes = (tokens, seqs, width, num_logits)
        src = self._cached(("tensors", index) + sizes, self._tensor_views, index, *sizes)
        if not self.static:
            return src
        out = self._cached(("device",) + sizes, self._device_views, *sizes)
        for name, dst in out.items():
            dst.copy_(src[name], non_blocking=True)
        if not self.cuda:
            return out
        event = self._events[index] or torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events[index] = event
        return out
