"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; vLLM's layout): one model over N ranks.

The scheduler and block pool run once, in the engine's process, which is rank 0 and samples; ranks
1..N-1 are workers that receive each step's SchedulerOutput (plain data) and run the same forward on their
shard. Files: config.py (what TP refuses), comm.py (the process group and its commands), sharding.py (a
rank's shard, built and loaded alone: heads, MLP columns/rows, vocabulary rows), messages.py (the step sent
to workers), worker.py (a worker's loop), executor.py (the driver: starts workers, sends steps, cleans up).
"""
