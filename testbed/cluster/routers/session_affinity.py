"""Session affinity: a conversation's next turn goes to the replica that served its previous turn, whose
prefix cache holds the history; a new conversation goes to the least-loaded replica.

Sticky sessions are what a front end does with a session key (a cookie, OpenAI's `user` field, a
conversation id), so the whole history stays on one replica. Where this deviates: there is no key in the
request, so the router infers the session from the prompt: it remembers the hash of the last full block
of every prompt it routed, and a request whose leading blocks contain one of those hashes (its prompt
extends that whole earlier prompt: a next turn) is that session's continuation. Each remembered turn is
continued once. With `load_factor` set, a continuation whose replica has more than
ceil(load_factor * (total outstanding + 1) / healthy replicas) outstanding requests goes to the least
loaded replica instead (Mirrokni et al.'s bound, as prefix_affinity), and the session moves there.
"""

import math

from testbed.cluster.routers.base import Router, least_loaded


class SessionAffinityRouter(Router):
    name = "session_affinity"

    def __init__(self, seed: int = 0, load_factor: float | None = None):
        super().__init__(seed)
        if load_factor is not None and (isinstance(load_factor, bool) or not load_factor >= 1):
            raise ValueError(f"session_affinity: load_factor must be null or >= 1, got {load_factor!r}")
        self.load_factor = load_factor
        self.tails: dict[int, int] = {}  # last full block hash of a routed prompt -> its replica
        self.last = -1
        self.num_sticky = 0

    def choose(self, request, healthy, num_replicas):
        by_index = {r.index: r for r in healthy}
        home = None
        for h in reversed(request.block_hashes):  # the longest earlier prompt this one extends
            if h in self.tails:
                home = by_index.get(self.tails.pop(h))
                break
        if home is not None and self.load_factor is not None:
            bound = math.ceil(self.load_factor * (sum(r.outstanding for r in healthy) + 1) / len(healthy))
            home = home if home.outstanding < bound else None
        if home is None:
            home = least_loaded(healthy, self.last, num_replicas)
            self.last = home.index
        else:
            self.num_sticky += 1
        if request.block_hashes:
            self.tails[request.block_hashes[-1]] = home.index
        return home.index
