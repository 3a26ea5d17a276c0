"""Host-side staging for a step's inputs: persistent block-table rows, pinned buffers, static device buffers.

`BlockTables` keeps every running request's block ids in a persistent numpy row and only writes the
blocks that are new since the last step, so building a step's block table is one numpy gather instead
of a Python loop over every block of every request.

`InputBuffers` owns, per input field, a host array the step is written into and a device tensor the
model reads. On CUDA the host arrays are pinned (double-buffered, guarded by an event) and copied with
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


class BlockTables:
    """request id -> a persistent row of block ids, synced incrementally from the KV manager's live lists.

    `blocks_of(request_id)` returns the KV manager's own list of a request's blocks (objects with a
    `block_id`). With `changes` (KVCacheManager.watch()), the manager reports which lists changed and
    from which position, so a step touches only those rows and otherwise just looks up row numbers.
    Without it every row is checked: a list only grows between steps (new blocks at the tail), is
    replaced by a new list after a free (finish, preemption) or, after a step that verified speculative
    drafts, may have its tail trimmed and regrown; rows are re-synced in full in the last two cases.
    Columns past a request's blocks may hold stale ids: nothing reads beyond a sequence's length.
    """

    def __init__(self, blocks_of, width: int, rows: int = 64, changes: dict | None = None):
        self.blocks_of = blocks_of
        self.changes = changes
        self.table = np.zeros((rows, max(width, 1)), dtype=np.int32)
        self.row_of: dict[str, int] = {}
        self.free_rows = list(range(rows - 1, -1, -1))
        self.entries: dict[str, list] = {}  # without `changes`: request id -> [live block list, synced]
        self.dirty: set[str] = set()  # without `changes`: drafts verified, the tail may be trimmed
        self._last = (None, None)  # (request ids, their rows) of the last call to rows()

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            row = self.row_of.pop(rid, None)
            if row is not None:
                self.free_rows.append(row)
                self._last = (None, None)
            self.entries.pop(rid, None)
            self.dirty.discard(rid)

    def _grow(self, rows: int, width: int) -> None:
        old = self.table
        rows, width = max(rows, old.shape[0]), max(width, old.shape[1])
        self.table = np.zeros((rows, width), dtype=np.int32)
        self.table[: old.shape[0], : old.shape[1]] = old
        self.free_rows.extend(range(rows - 1, old.shape[0] - 1, -1))

    def rows(self, request_ids: list[str]) -> np.ndarray:
        """Row index of each request (in order), with its row up to date. Read-only: the array is
        handed out again while the batch stays the same (a row is a request's until it is forgotten)."""
        if self.changes is None:
            self._check_all(request_ids)
        elif self.changes:
            self._apply_changes()
        last_ids, last_rows = self._last
        if request_ids == last_ids:  # steady decoding: the same batch as the last step
            return last_rows
        row_of = self.row_of
        try:
            rows = np.array([row_of[rid] for rid in request_ids], dtype=np.int64)
        except KeyError:  # requests in their first step: give them rows
            for rid in request_ids:
                if rid not in row_of:
                    self._write(self._new_row(rid), self.blocks_of(rid) or (), 0)
            rows = np.array([row_of[rid] for rid in request_ids], dtype=np.int64)
        self._last = (request_ids, rows)
        return rows

    def _new_row(self, rid: str) -> int:
        if not self.free_rows:
            self._grow(2 * self.table.shape[0], 0)
        row = self.row_of[rid] = self.free_rows.pop()
        self._last = (None, None)
        return row

    def _write(self, row: int, blocks, first: int) -> None:
        """Copy block ids from position `first` on into the row."""
        n = len(blocks)
        if n > self.table.shape[1]:
            self._grow(0, 2 * n)
        if n == first + 1:  # the usual change: one block appended
            self.table[row, first] = blocks[first].block_id
        elif n > first:
            self.table[row, first:n] = [b.block_id for b in blocks[first:n]]

    def _apply_changes(self) -> None:
        row_of, blocks_of = self.row_of, self.blocks_of
        for rid, first in self.changes.items():
            row = row_of.get(rid)
            if row is not None:  # not yet given a row: written in full when it is
                self._write(row, blocks_of(rid) or (), first)
        self.changes.clear()

    def _check_all(self, request_ids: list[str]) -> None:
        """No change reports: compare every request's live list with what its row last got."""
        entries, blocks_of = self.entries, self.blocks_of
        for rid in self.dirty:  # re-sync these rows from the start
            entry = entries.get(rid)
            if entry is not None:
                entry[1] = -1
        self.dirty.clear()
        for rid in request_ids:
            blocks = blocks_of(rid) or ()
            entry = entries.get(rid)
            if entry is not None and entry[0] is blocks and entry[1] == len(blocks):
                continue  # the common case: nothing new
            row = self.row_of.get(rid)
            if row is None:
                row = self._new_row(rid)
            if entry is None or entry[0] is not blocks or entry[1] < 0:
                entry = entries[rid] = [blocks, 0]  # new, re-allocated or possibly trimmed: all of it
            self._write(row, blocks, min(entry[1], len(blocks)))
            entry[1] = len(blocks)  # shrunk (trimmed tail): the prefix is still right


class InputBuffers:
    """Fixed-capacity staging for one step's inputs (see the module docstring)."""

    def __init__(
        self,
        block_size: int,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        device,
        blocks_of=None,
        static: bool | None = None,
        changes: dict | None = None,
    ):
        self.block_size = block_size
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.static = self.cuda if static is None else static  # fixed device tensors, copied into
        self.tables = BlockTables(blocks_of, max_blocks_per_seq, max(max_seqs, 1), changes) if blocks_of else None
        self.generation = 0  # bumped whenever the device tensors move (captured graphs must notice)
        self._allocate(max_tokens, max_seqs, max_blocks_per_seq)

    @classmethod
    def for_engine(cls, engine, extra_seqs: int = 0, static: bool | None = None, device=None) -> "InputBuffers":
        """Sized by the engine's budgets; extra_seqs covers batches padded past max_num_seqs (graphs)."""
        c = engine.config
        seqs = max(c.max_num_seqs, extra_seqs)
        width = -(-engine.max_model_len // c.block_size) + 8  # + a few for speculative lookahead
        watch = getattr(engine.kv, "watch", None)  # change reports, where the allocator gives them
        return cls(
            c.block_size,
            max(c.max_num_batched_tokens, seqs),
            seqs,
            width,
            device or engine.device,
            engine.kv.req_blocks.get,
            static,
            watch() if watch else None,
        )

    def _allocate(self, tokens: int, seqs: int, width: int) -> None:
        self.max_tokens, self.max_seqs, self.max_width = tokens, seqs, width
        sizes = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        num_sets = 2 if self.cuda else 1

        def host(size, dtype):
            t = torch.zeros(size, dtype=_TORCH[dtype], pin_memory=self.cuda)
            return t, t.numpy()

        self._host = []  # per set: field -> (tensor, numpy view); "block_tables" flat
        for _ in range(num_sets):
            bufs = {name: host(sizes[kind], dtype) for name, (dtype, kind) in FIELDS.items()}
            bufs["block_tables"] = host(seqs * width, np.int32)
            self._host.append(bufs)
        self._events = [None] * num_sets
        self._set = 0
        self._views: dict[tuple, dict] = {}  # sizes -> the slices handed out (see _cached)
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

    def host_arrays(self, tokens: int, seqs: int, width: int) -> dict[str, np.ndarray]:
        """Writable host arrays for the next step (the pinned set's last copies have finished)."""
        self._set = (self._set + 1) % len(self._host)
        event = self._events[self._set]
        if event is not None and not event.query():
            event.synchronize()  # copies issued two steps ago: done unless the GPU is far behind
        return self._cached(("host", self._set, tokens, seqs, width), self._host_views, tokens, seqs, width)

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

    def _host_views(self, tokens: int, seqs: int, width: int) -> dict[str, np.ndarray]:
        bufs = self._host[self._set]
        sizes = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        out = {name: bufs[name][1][: sizes[kind]] for name, (_, kind) in FIELDS.items()}
        out["block_tables"] = bufs["block_tables"][1][: seqs * width].reshape(seqs, width)
        return out

    def _lengths(self, tokens: int, seqs: int, num_logits: int) -> dict[str, int]:
        lengths = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        lengths = {name: lengths[kind] for name, (_, kind) in FIELDS.items()}
        lengths["logits_indices"] = num_logits
        return lengths

    def _tensor_views(self, tokens: int, seqs: int, width: int, num_logits: int) -> dict[str, torch.Tensor]:
        """Host tensors of these sizes (what the model reads when there are no static device buffers)."""
        bufs = self._host[self._set]
        out = {name: bufs[name][0][:n] for name, n in self._lengths(tokens, seqs, num_logits).items()}
        out["block_tables"] = bufs["block_tables"][0][: seqs * width].view(seqs, width)
        return out

    def _device_views(self, tokens: int, seqs: int, width: int, num_logits: int) -> dict[str, torch.Tensor]:
        out = {name: self.dev[name][:n] for name, n in self._lengths(tokens, seqs, num_logits).items()}
        out["block_tables"] = self.dev["block_tables"][:seqs, :width]
        return out

    def to_device(self, tokens: int, seqs: int, width: int, num_logits: int) -> dict[str, torch.Tensor]:
        """Device tensors holding what host_arrays() received (asynchronous copies on CUDA)."""
        sizes = (tokens, seqs, width, num_logits)
        src = self._cached(("tensors", self._set) + sizes, self._tensor_views, *sizes)
        if not self.static:
            return src
        out = self._cached(("device",) + sizes, self._device_views, *sizes)
        for name, dst in out.items():
            dst.copy_(src[name], non_blocking=True)
        if not self.cuda:
            return out
        event = self._events[self._set] or torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events[self._set] = event
        return out
