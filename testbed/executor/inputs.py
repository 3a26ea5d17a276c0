"""Flatten a SchedulerOutput into the model's inputs: token ids, positions, slots, attention metadata.

One Python pass over the scheduled requests collects what only they know (tokens, computed counts);
everything else is numpy over the whole batch. Block tables come from the executor's persistent rows
(testbed.executor.block_tables); the arrays are staged in reusable (pinned) host memory and copied to
fixed device tensors without waiting for the device (testbed.executor.host_buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np
import torch

from testbed.attention.backend import AttentionMetadata
from testbed.executor.block_tables import BlockTables
from testbed.executor.host_buffers import InputBuffers


class KnownTokens(Protocol):
    """A request's known tokens as staging indexes them: a list, or a worker's window of it."""

    def __len__(self) -> int: ...

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...


class StagedRequest(Protocol):
    """What staging reads of a scheduled request (testbed.request.Request, or a worker's RequestView)."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> KnownTokens: ...

    @property
    def spec_token_ids(self) -> list[int]: ...


class StepToStage(Protocol):
    """What staging reads of a step (a SchedulerOutput, or a worker's WorkerStep)."""

    @property
    def requests(self) -> Sequence[StagedRequest]: ...

    @property
    def num_new_tokens(self) -> list[int]: ...

    @property
    def num_computed_tokens(self) -> list[int]: ...

    @property
    def num_known_tokens(self) -> list[int]: ...

    @property
    def request_ids(self) -> list[str]: ...


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the hidden states to turn into logits
    num_logits: list[int]  # per scheduled request: how many of those rows (0 = mid-prefill)


@dataclass
class StagedInputs:
    """A step's inputs written to host buffer set `index`, not yet on the device. `placeholders` lists the
    token rows whose token an earlier step, still in flight, is sampling: (row, request id); to_device
    fills them with those tokens (async scheduling) before the copy."""

    buffers: InputBuffers
    index: int
    sizes: tuple[int, int, int, int]  # token rows, sequence rows, block-table width, logits rows
    num_seqs: int
    padded: bool
    placeholders: list[tuple[int, str]]
    num_logits: list[int]
    max_query_len: int
    max_seq_len: int

    def to_device(self, last_tokens: dict[str, int] | None = None) -> ModelInputs:
        """last_tokens: request id -> the token the previous step sampled for it (placeholders only)."""
        if self.placeholders:
            ids = self.buffers.host_arrays(self.index, *self.sizes[:3])["input_ids"]
            for row, request_id in self.placeholders:
                # a request the previous step failed for got no token: it has ended, this row is discarded
                ids[row] = (last_tokens or {}).get(request_id, 0)
        t = self.buffers.to_device(self.index, *self.sizes)
        if self.padded:
            n = self.num_seqs
            t = {
                name: (v if name == "logits_indices" else v[: n + 1] if name == "query_start_loc" else v[:n])
                for name, v in t.items()
            }
        meta = AttentionMetadata(
            slot_mapping=t["slot_mapping"],
            query_start_loc=t["query_start_loc"],
            seq_lens=t["seq_lens"],
            block_tables=t["block_tables"],
            max_query_len=self.max_query_len,
            max_seq_len=self.max_seq_len,
        )
        return ModelInputs(t["input_ids"], t["positions"], meta, t["logits_indices"], self.num_logits)


def _token_ids(out: StepToStage) -> tuple[list[int], list[tuple[int, str]], bool]:
    """The step's input tokens in row order, the placeholder rows, and whether drafts ride along.

    Position p of a request holds its known token p, else (p < its known count) the output a step in
    flight is sampling (a placeholder, id 0 until filled), else a speculative draft."""
    requests, num_new, starts, known = out.requests, out.num_new_tokens, out.num_computed_tokens, out.num_known_tokens
    if sum(num_new) == len(requests):  # one token each, e.g. decode: no per-request branching
        try:
            return [r.all_token_ids[s] for r, s in zip(requests, starts)], [], False
        except IndexError:  # a placeholder or a lone draft: the general path
            pass
    token_ids: list[int] = []
    placeholders: list[tuple[int, str]] = []
    drafted = False
    for r, s, k, n_known in zip(requests, starts, num_new, known):
        tokens = r.all_token_ids
        token_ids += tokens[s : s + k]
        if s + k > len(tokens):
            for _ in range(max(s, len(tokens)), min(s + k, n_known)):
                placeholders.append((len(token_ids), r.request_id))
                token_ids.append(0)
            if s + k > n_known:  # speculative drafts ride at the end
                token_ids += r.spec_token_ids[: s + k - n_known]
                drafted = True
    return token_ids, placeholders, drafted


def stage_inputs(
    out: StepToStage, tables: BlockTables, buffers: InputBuffers, pad_to: int | None = None
) -> StagedInputs:
    """Write the scheduled requests' inputs to the next host buffer set (their rows in `tables` already
    updated from `out`). Reads only what the SchedulerOutput recorded and the requests' known tokens, so it
    may run while an earlier step still executes.

    pad_to: a decode batch (one token per request) is padded to this many rows for a captured CUDA
    graph; padding rows write no KV (slot -1) and attend to nothing (length 0). The tensors to_device
    returns cover the real rows only.
    """
    requests, num_new = out.requests, out.num_new_tokens
    n = len(requests)
    token_ids, placeholders, drafted = _token_ids(out)
    total = len(token_ids)
    one_each = total == n and not drafted  # decode: token i is request i's, no repeats needed

    start = np.array(out.num_computed_tokens, dtype=np.int64)
    if one_each:
        end = start + 1
        query_start = np.arange(n + 1, dtype=np.int64)
        positions = start
    else:
        new = np.array(num_new, dtype=np.int64)
        end = start + new
        query_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new, out=query_start[1:])
        positions = np.repeat(start - query_start[:-1], new) + np.arange(total, dtype=np.int64)
    rows = tables.rows(out.request_ids)
    table = tables.table
    block_size = buffers.block_size
    max_seq_len = int(end.max(initial=0))
    width = max(-(-max_seq_len // block_size), 1)
    pages = positions // block_size
    slots = table[rows if one_each else np.repeat(rows, new), pages].astype(np.int64) * block_size
    slots += positions - pages * block_size
    # logits wherever a next token must be sampled or a draft verified
    k = np.maximum(end - np.array(out.num_known_tokens, dtype=np.int64) + 1, 0)
    num_logits = k.tolist()
    if one_each:  # k is 0 (mid-prefill) or 1: the rows with k = 1
        logits_indices = np.flatnonzero(k)
    else:
        num_k = int(k.sum())
        logits_indices = np.repeat(query_start[1:] - k, k) + (np.arange(num_k) - np.repeat(np.cumsum(k) - k, k))
    num_k = len(logits_indices)

    padded = n if pad_to is None else pad_to
    num_rows_tokens = total if pad_to is None else pad_to
    assert pad_to is None or (total == n and pad_to >= n), "only decode batches are padded"
    buffers.ensure(num_rows_tokens, padded, width)
    index = buffers.next_set()
    h = buffers.host_arrays(index, num_rows_tokens, padded, width)
    h["input_ids"][:total] = token_ids
    h["positions"][:total] = positions
    h["slot_mapping"][:total] = slots
    h["query_start_loc"][: n + 1] = query_start
    h["seq_lens"][:n] = end
    h["logits_indices"][:num_k] = logits_indices
    _stage_tables(h["block_tables"][:n], tables, rows, width, buffers, index)
    if padded > n:
        h["input_ids"][n:] = 0
        h["positions"][n:] = 0
        h["slot_mapping"][n:] = -1
        h["query_start_loc"][n + 1 :] = n
        h["seq_lens"][n:] = 0
        h["block_tables"][n:] = 0
    return StagedInputs(
        buffers,
        index,
        (num_rows_tokens, padded, width, num_k),
        n,
        padded > n,
        placeholders,
        num_logits,
        max(num_new, default=0),
        max_seq_len,
    )


def _stage_tables(
    dst: np.ndarray, tables: BlockTables, rows: np.ndarray, width: int, buffers: InputBuffers, index: int
) -> None:
    """The scheduled rows of the block tables into set `index`. The set still holds what it was given two
    steps ago; while the batch (the same row index array) and the width are the same, only the rows
    written since are copied (vLLM v1's persistent batch: unchanged rows are not rewritten)."""
    held = buffers.staged_tables[index]
    if held is not None and held[0] is rows and held[1] == width:
        changed = tables.changed_since(rows, held[2])
        if len(changed):
            dst[changed] = tables.table[rows[changed], :width]
    else:
        dst[:] = tables.table[rows, :width]
    buffers.staged_tables[index] = (rows, width, tables.version)


def prepare_inputs(
    out: StepToStage, tables: BlockTables, buffers: InputBuffers, pad_to: int | None = None
) -> ModelInputs:
    """stage_inputs + to_device, for a step with no placeholder to fill."""
    return stage_inputs(out, tables, buffers, pad_to).to_device()
