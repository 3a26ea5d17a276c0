"""Where a static allocator puts a request's contiguous run of blocks: first fit or a buddy system.

A placement manages the free space of a pool of `num_blocks` blocks:

    take(need)      -> (start, length) of a run of >= need blocks, or None if no free piece is big enough
    give(start, n)  return a run taken earlier
    fits(need)      whether take(need) would succeed
    free_runs()     lengths of the free pieces a single request could use (for external fragmentation)
    held_length(n)  how many blocks take(n) hands out (the buddy system rounds up to a power of two)

first_fit  lowest-addressed hole that is big enough; holes are coalesced on free (the runs are exact).
buddy      the binary buddy system (Knuth, TAOCP vol. 1, 2.5): runs of 2^k blocks aligned to their
           size, split from the smallest free piece that fits (lowest address first) and merged with
           their buddy when both are free. The vLLM paper's Orca baselines assume this placement (Sec. 6.1).
           A pool that is not a power of two is a row of power-of-two trees (e.g. 12 = 8 + 4).
"""

import bisect


class FirstFit:
    name = "first_fit"

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.holes: list[list[int]] = [[0, num_blocks]]  # [start, length], sorted by start, coalesced
        self.num_free = num_blocks

    def held_length(self, need: int) -> int:
        return need

    def _first(self, need: int) -> int | None:
        for i, (_, length) in enumerate(self.holes):
            if length >= need:
                return i
        return None

    def fits(self, need: int) -> bool:
        return self._first(need) is not None

    def take(self, need: int) -> tuple[int, int] | None:
        i = self._first(need)
        if i is None:
            return None
        start = self.holes[i][0]
        if self.holes[i][1] == need:
            del self.holes[i]
        else:
            self.holes[i][0] += need
            self.holes[i][1] -= need
        self.num_free -= need
        return start, need

    def give(self, start: int, length: int) -> None:
        self.num_free += length
        i = bisect.bisect_left(self.holes, [start, 0])
        self.holes.insert(i, [start, length])
        if i + 1 < len(self.holes) and start + length == self.holes[i + 1][0]:  # merge right
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:  # merge left
            self.holes[i - 1][1] += self.holes.pop(i)[1]

    def free_runs(self) -> list[int]:
        return [length for _, length in self.holes]

    def free_spans(self) -> list[tuple[int, int]]:
        return [(s, n) for s, n in self.holes]

    def check_invariants(self) -> None:
        assert all(a[0] + a[1] < b[0] for a, b in zip(self.holes, self.holes[1:])), self.holes
        assert self.num_free == sum(n for _, n in self.holes)


def _order(n: int) -> int:
    """Smallest k with 2^k >= n."""
    return max(n - 1, 0).bit_length()


class Buddy:
    name = "buddy"

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.trees: list[tuple[int, int]] = []  # (base, order), by base: the pool as power-of-two trees
        base = 0
        for k in range(num_blocks.bit_length() - 1, -1, -1):
            if num_blocks >> k & 1:
                self.trees.append((base, k))
                base += 1 << k
        self._bases = [b for b, _ in self.trees]
        self.free: dict[int, set[int]] = {k: {b} for b, k in self.trees}  # order -> starts of free pieces
        self.num_free = num_blocks

    def held_length(self, need: int) -> int:
        return 1 << _order(need)

    def _smallest_free(self, order: int) -> int | None:
        """The smallest order >= `order` with a free piece."""
        candidates = [k for k, starts in self.free.items() if k >= order and starts]
        return min(candidates) if candidates else None

    def fits(self, need: int) -> bool:
        return self._smallest_free(_order(need)) is not None

    def take(self, need: int) -> tuple[int, int] | None:
        want = _order(need)
        k = self._smallest_free(want)
        if k is None:
            return None
        start = min(self.free[k])
        self.free[k].discard(start)
        while k > want:  # split: keep the lower half, free the upper
            k -= 1
            self.free.setdefault(k, set()).add(start + (1 << k))
        self.num_free -= 1 << want
        return start, 1 << want

    def give(self, start: int, length: int) -> None:
        k = _order(length)
        assert length == 1 << k, f"buddy runs are powers of two, got {length}"
        self.num_free += length
        base, top = self.trees[bisect.bisect_right(self._bases, start) - 1]
        while k < top:
            buddy = base + ((start - base) ^ (1 << k))
            if buddy not in self.free.get(k, ()):
                break
            self.free[k].discard(buddy)
            start = min(start, buddy)
            k += 1
        self.free.setdefault(k, set()).add(start)

    def free_runs(self) -> list[int]:
        return [1 << k for k, starts in self.free.items() for _ in starts]

    def free_spans(self) -> list[tuple[int, int]]:
        return sorted((s, 1 << k) for k, starts in self.free.items() for s in starts)

    def check_invariants(self) -> None:
        assert self.num_free == sum(self.free_runs()), (self.num_free, self.free)
        for k, starts in self.free.items():
            for s in starts:
                base, top = self.trees[bisect.bisect_right(self._bases, s) - 1]
                assert k <= top and (s - base) % (1 << k) == 0, f"piece {s} of order {k} misaligned"
                if k < top:  # two free buddies would have been merged
                    assert base + ((s - base) ^ (1 << k)) not in starts, f"unmerged buddies at order {k}"


PLACEMENTS: dict[str, type[FirstFit] | type[Buddy]] = {"first_fit": FirstFit, "buddy": Buddy}
