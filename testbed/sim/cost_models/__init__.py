"""Cost models for the simulated executor: the duration of one step from its shape (testbed.sim.shape)."""
