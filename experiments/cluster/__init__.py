"""Cluster drivers: a trace through N replicas behind a router, simulated or real (experiments.cluster.runner)."""
