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
    `block_id`). A list only grows between steps (new blocks at the tail), is replaced by a new list
    after a free (finish, preemption) or, after a step that verified speculative drafts, may have its
    tail trimmed and regrown; rows are re-synced in full in the last two cases.
    """

    def __init__(self, blocks_of, width: int, rows: int = 64):
        self.blocks_of = blocks_of
        self.table = np.zeros((rows, max(width, 1)), dtype=np.int32)
        self.entries: dict[str, list] = {}       # request id -> [row, live block list, blocks synced]
        self.free_rows = list(range(rows - 1, -1, -1))
        self.dirty: set[str] = set()             # drafts were verified: the tail may have been trimmed

    def forget(self, request_ids) -> None:
        for rid in request_ids:
            entry = self.entries.pop(rid, None)
            if entry is not None:
                self.free_rows.append(entry[0])
            self.dirty.discard(rid)

    def _grow(self, rows: int, width: int) -> None:
        old = self.table
        rows, width = max(rows, old.shape[0]), max(width, old.shape[1])
        self.table = np.zeros((rows, width), dtype=np.int32)
        self.table[:old.shape[0], :old.shape[1]] = old
        self.free_rows.extend(range(rows - 1, old.shape[0] - 1, -1))

    def rows(self, request_ids) -> np.ndarray:
        """Row index of each request (in order), with its row up to date."""
        entries, blocks_of = self.entries, self.blocks_of
        for rid in self.dirty:                   # re-sync these rows from the start
            entry = entries.get(rid)
            if entry is not None:
                entry[2] = -1
        self.dirty.clear()
        rows = []
        for rid in request_ids:
            blocks = blocks_of(rid) or ()
            entry = entries.get(rid)
            if entry is not None and entry[1] is blocks and entry[2] == len(blocks):
                rows.append(entry[0])            # the common case: nothing new
                continue
            rows.append(self._sync(rid, entry, blocks))
        return np.array(rows, dtype=np.int64)

    def _sync(self, rid: str, entry, blocks) -> int:
        if entry is None:
            if not self.free_rows:
                self._grow(2 * self.table.shape[0], 0)
            entry = self.entries[rid] = [self.free_rows.pop(), blocks, 0]
        elif entry[1] is not blocks or entry[2] < 0:
            entry[1], entry[2] = blocks, 0       # a new list (re-allocated) or possibly trimmed: all of it
        synced, n = entry[2], len(blocks)
        if n > self.table.shape[1]:
            self._grow(0, 2 * n)
        if n > synced:
            self.table[entry[0], synced:n] = [b.block_id for b in blocks[synced:n]]
        entry[2] = n                             # shrunk (trimmed tail): the prefix is still right
        return entry[0]


class InputBuffers:
    """Fixed-capacity staging for one step's inputs (see the module docstring)."""

    def __init__(self, block_size: int, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device,
                 blocks_of=None, static: bool | None = None):
        self.block_size = block_size
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.static = self.cuda if static is None else static     # fixed device tensors, copied into
        self.tables = BlockTables(blocks_of, max_blocks_per_seq, max(max_seqs, 1)) if blocks_of else None
        self.generation = 0        # bumped whenever the device tensors move (captured graphs must notice)
        self._allocate(max_tokens, max_seqs, max_blocks_per_seq)

    @classmethod
    def for_engine(cls, engine, extra_seqs: int = 0, static: bool | None = None, device=None) -> "InputBuffers":
        """Sized by the engine's budgets; extra_seqs covers batches padded past max_num_seqs (graphs)."""
        c = engine.config
        seqs = max(c.max_num_seqs, extra_seqs)
        width = -(-engine.max_model_len // c.block_size) + 8      # + a few for speculative lookahead
        return cls(c.block_size, max(c.max_num_batched_tokens, seqs), seqs, width, device or engine.device,
                   engine.kv.req_blocks.get, static)

    def _allocate(self, tokens: int, seqs: int, width: int) -> None:
        self.max_tokens, self.max_seqs, self.max_width = tokens, seqs, width
        sizes = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        num_sets = 2 if self.cuda else 1

        def host(size, dtype):
            t = torch.zeros(size, dtype=_TORCH[dtype], pin_memory=self.cuda)
            return t, t.numpy()

        self._host = []                # per set: field -> (tensor, numpy view); "block_tables" flat
        for _ in range(num_sets):
            bufs = {name: host(sizes[kind], dtype) for name, (dtype, kind) in FIELDS.items()}
            bufs["block_tables"] = host(seqs * width, np.int32)
            self._host.append(bufs)
        self._events = [None] * num_sets
        self._set = 0
        if self.static:
            self.dev = {name: torch.zeros(sizes[kind], dtype=_TORCH[dtype], device=self.device)
                        for name, (dtype, kind) in FIELDS.items()}
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
            event.synchronize()      # copies issued two steps ago: done unless the GPU is far behind
        bufs = self._host[self._set]
        sizes = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        out = {name: bufs[name][1][:sizes[kind]] for name, (_, kind) in FIELDS.items()}
        out["block_tables"] = bufs["block_tables"][1][:seqs * width].reshape(seqs, width)
        return out

    def to_device(self, tokens: int, seqs: int, width: int, num_logits: int) -> dict[str, torch.Tensor]:
        """Device tensors holding what host_arrays() received (asynchronous copies on CUDA)."""
        bufs = self._host[self._set]
        lengths = {"tokens": tokens, "seqs": seqs, "seqs+1": seqs + 1}
        lengths = {name: lengths[kind] for name, (_, kind) in FIELDS.items()}
        lengths["logits_indices"] = num_logits
        if not self.static:
            out = {name: bufs[name][0][:n] for name, n in lengths.items()}
            out["block_tables"] = bufs["block_tables"][0][:seqs * width].view(seqs, width)
            return out
        out = {}
        for name, n in lengths.items():
            dst = self.dev[name][:n]
            dst.copy_(bufs[name][0][:n], non_blocking=True)
            out[name] = dst
        dst = self.dev["block_tables"][:seqs, :width]
        dst.copy_(bufs["block_tables"][0][:seqs * width].view(seqs, width), non_blocking=True)
        out["block_tables"] = dst
        if not self.cuda:
            return out
        event = self._events[self._set] or torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._events[self._set] = event
        return out
