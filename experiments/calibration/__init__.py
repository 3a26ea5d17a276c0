"""Measuring the real engine's steps and fitting the simulator's profile cost model."""
