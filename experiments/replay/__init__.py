"""Replay drivers: a trace's requests fed to a replica set (one engine, a cluster) or to a server."""
