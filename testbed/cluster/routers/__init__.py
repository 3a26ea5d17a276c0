"""Routers: which replica serves a request. One small file per policy, one interface (base.Router)."""

import inspect

from testbed.cluster.routers.base import NoHealthyReplica, ReplicaSnapshot, ReplicaView, Router, RouteRequest
from testbed.plugins import load_class

# name -> "module:Class", imported on demand so a new router is one file plus one line here.
ROUTERS = {
    "round_robin": "testbed.cluster.routers.round_robin:RoundRobinRouter",
    "random": "testbed.cluster.routers.random:RandomRouter",
    "least_outstanding": "testbed.cluster.routers.least_outstanding:LeastOutstandingRouter",
    "least_kv": "testbed.cluster.routers.least_kv:LeastKVRouter",
    "power_of_two": "testbed.cluster.routers.power_of_two:PowerOfTwoRouter",
    "prefix_affinity": "testbed.cluster.routers.prefix_affinity:PrefixAffinityRouter",
    "session_affinity": "testbed.cluster.routers.session_affinity:SessionAffinityRouter",
}


def router_class(name: str) -> type[Router]:
    """The router registered as `name`, or the user's own Router subclass at the import path `name`."""
    return load_class("router", ROUTERS, name, Router)


def get_router(name: str, seed: int = 0, **options) -> Router:
    cls = router_class(name)
    known = [p for p in inspect.signature(cls).parameters if p != "seed"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"router {name!r} takes no options {unknown}; its options: {known or 'none'}")
    return cls(seed=seed, **options)


__all__ = ["ROUTERS", "NoHealthyReplica", "ReplicaSnapshot", "ReplicaView", "RouteRequest", "Router", "get_router"]
