"""The one call the executor builder makes: None without TP, else the started group on rank 0."""

import torch


def start_tensor_parallel(config, spec, kernel: str, num_blocks: int, num_cpu_blocks, device, dtype):
    """Start (or join, under torchrun) the workers and send them the plan:
    a testbed.parallel.executor.TensorParallel, or None when tensor_parallel_size is 1."""
    n = config.parallel.tensor_parallel_size
    if n == 1:
        return None
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.device_count() < n:
        raise ValueError(
            f"parallel.tensor_parallel_size={n} needs that many GPUs on this machine, "
            f"found {torch.cuda.device_count()} (several machines: launch with torchrun or srun)"
        )
    from testbed.executor.kv_cache import kv_cache_dtype
    from testbed.parallel.executor import TensorParallel
    from testbed.parallel.worker import WorkerPlan

    name = str(dtype).removeprefix("torch.")
    kv = str(kv_cache_dtype(config.cache, dtype)).removeprefix("torch.")
    return TensorParallel(
        WorkerPlan(config, num_blocks, num_cpu_blocks, name, kv, device.type, kernel, torch.get_num_threads())
    )
