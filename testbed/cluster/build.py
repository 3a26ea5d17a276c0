"""Assemble a simulated cluster from one engine config and the cluster config."""

from __future__ import annotations

from testbed.cluster.config import ClusterConfig
from testbed.cluster.routers import get_router
from testbed.cluster.simulated import SimulatedCluster
from testbed.config import EngineConfig
from testbed.executor_kinds import executor_kind


def replica_config(config: EngineConfig, index: int) -> EngineConfig:
    """Replica `index`'s engine config: the same engine, its own seeds (sampling, simulated draws), so
    replicas draw independently; replica 0 is exactly the single-engine config."""
    return executor_kind(config.executor.name).replica_config(config, index)


def build_simulated_cluster(config: EngineConfig, cluster: ClusterConfig) -> SimulatedCluster:
    from testbed import Engine
    from testbed.sim.clock import VirtualClock

    executor_kind(config.executor.name).check_cluster(config)
    engines = [Engine(replica_config(config, i), clock=VirtualClock()) for i in range(cluster.num_replicas)]
    router = get_router(cluster.router, seed=config.seed, **cluster.router_options)
    if cluster.disaggregated:
        from testbed.cluster.disaggregated import DisaggregatedCluster
        from testbed.cluster.links import load_link

        decode_router = get_router(cluster.decode_router, seed=config.seed + 1)
        return DisaggregatedCluster(
            engines[: cluster.prefill_replicas],
            engines[cluster.prefill_replicas :],
            router,
            decode_router,
            load_link(cluster.link),
        )
    return SimulatedCluster(engines, router)
