"""Experiment runner: trace loaders and replay tooling."""
