"""The executor's persistent block tables: request id -> a numpy row of its block ids.

Rows change only as the SchedulerOutput says (`block_updates`: the ids from the first changed position on;
`finished_ids`: rows to release), so building a step's table is one numpy gather over the scheduled rows.
Columns past a request's blocks may hold stale ids: nothing reads beyond a sequence's length. Each row
records the `version` (a count of the applies that changed some row) that last wrote it, so a copy of
the rows made at an earlier version is brought up to date by rewriting only the rows written since
(input staging: testbed.executor.inputs).
"""

import numpy as np


class BlockTables:
    def __init__(self, width: int, rows: int = 64):
        self.table = np.zeros((max(rows, 1), max(width, 1)), dtype=np.int32)
        self.row_of: dict[str, int] = {}
        self.free_rows = list(range(self.table.shape[0] - 1, -1, -1))
        self._last: tuple = (None, None)  # (request ids, their rows) of the last call to rows()
        self.version = 0
        self.row_version = np.zeros(self.table.shape[0], dtype=np.int64)  # per row: the version that wrote it

    def apply(self, finished_ids: list[str], block_updates: dict[str, tuple[int, list[int]]]) -> None:
        for rid in finished_ids:
            row = self.row_of.pop(rid, None)
            if row is not None:
                self.free_rows.append(row)
                self._last = (None, None)
        if not block_updates:
            return
        row_of = self.row_of
        written = []
        for rid, (first, ids) in block_updates.items():
            row = row_of.get(rid)
            if row is None:
                row = self._new_row(rid)
            end = first + len(ids)
            if end > self.table.shape[1]:
                self._grow(0, 2 * end)
            if len(ids) == 1:  # the usual change: one block appended
                self.table[row, first] = ids[0]
            elif ids:
                self.table[row, first:end] = ids
            written.append(row)
        self.version += 1
        self.row_version[written] = self.version

    def changed_since(self, rows: np.ndarray, version: int) -> np.ndarray:
        """Positions in `rows` of the rows written after `version`."""
        return np.flatnonzero(self.row_version[rows] > version)

    def row(self, request_id: str) -> np.ndarray:
        return self.table[self.row_of[request_id]]

    def rows(self, request_ids: list[str]) -> np.ndarray:
        """Row index of each request, in order. Read-only: the array is handed out again while the batch
        stays the same."""
        last_ids, last_rows = self._last
        if request_ids is last_ids or request_ids == last_ids:  # steady decoding: the batch of the last step
            return last_rows
        row_of = self.row_of
        rows = np.array([row_of[rid] for rid in request_ids], dtype=np.int64)
        self._last = (request_ids, rows)
        return rows

    def _new_row(self, rid: str) -> int:
        if not self.free_rows:
            self._grow(2 * self.table.shape[0], 0)
        row = self.row_of[rid] = self.free_rows.pop()
        self._last = (None, None)
        return row

    def _grow(self, rows: int, width: int) -> None:
        old = self.table
        rows, width = max(rows, old.shape[0]), max(width, old.shape[1])
        self.table = np.zeros((rows, width), dtype=np.int32)
        self.table[: old.shape[0], : old.shape[1]] = old
        self.row_version = np.concatenate([self.row_version, np.zeros(rows - old.shape[0], dtype=np.int64)])
        self.free_rows.extend(range(rows - 1, old.shape[0] - 1, -1))
