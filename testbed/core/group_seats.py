"""Seats held for parallel-sampling groups (testbed.sequence_group) between admission and fork.

A group runs as its first sequence until that sequence has computed the prompt; it is admitted only with a
seat (a place under max_num_seqs) for every sequence, and holds the others' seats until its siblings start
(Scheduler._fork) or the leader leaves the running set (finished, aborted, preempted)."""

from testbed.request import Request


class GroupSeats:
    def __init__(self) -> None:
        self.unforked: set[Request] = set()  # running leaders whose siblings have not started
        self.reserved = 0  # seats those leaders hold for their siblings

    def needed(self, request: Request) -> int:
        """Seats a waiting request takes: one, or one per sequence for a group not yet forked."""
        group = request.group
        return 1 if group is None or group.forked else len(group.sequences)

    def hold(self, leader: Request) -> None:
        """A group's leader was admitted: keep its siblings' seats."""
        self.unforked.add(leader)
        self.reserved += len(leader.group.sequences) - 1

    def release(self, leader: Request) -> None:
        """The siblings start now (their seats become theirs) or never will (the leader left)."""
        if leader in self.unforked:
            self.unforked.discard(leader)
            self.reserved -= len(leader.group.sequences) - 1
