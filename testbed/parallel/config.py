"""What tensor parallelism can run, refused early with errors that name the key."""

from dataclasses import replace

from testbed.models.arch import ModelArch
from testbed.spec.config import proposer_class

# kernels whose layers run module by module (the all-reduces live in the modules); kernel=cpu fuses a decode
# step's layers in C++ (decode_layers) and keeps packed weight copies, so it would skip them
TP_KERNELS = ("torch", "triton")


def tp_kernel(kernel: str, tensor_parallel_size: int, device_type: str) -> str:
    """kernel=auto under TP: triton on CUDA, the torch reference on a CPU (not the fused C++ layers)."""
    if tensor_parallel_size == 1 or kernel != "auto":
        return kernel
    return "triton" if device_type == "cuda" else "torch"


def check_model_parallel(config) -> None:
    """What an EngineConfig alone shows the real engine cannot run split over its ranks (a simulation's
    tensor parallelism is priced by testbed.parallel.sim_cost instead)."""
    if config.parallel.tensor_parallel_size == 1:
        return
    kernel = config.executor.kernel
    if kernel not in ("auto",) + TP_KERNELS:
        raise ValueError(
            f"kernel={kernel} does not run under tensor parallelism (it fuses the decoder layers past the "
            f"all-reduces); use kernel=torch or kernel=triton (CUDA)"
        )
    spec = config.speculative
    if spec.enabled and proposer_class(spec.method).writes_target_kv:
        raise ValueError(
            f"spec.method={spec.method} drafts into the target model's KV cache (its proposer's writes_target_kv) "
            "on rank 0 alone, so the workers' KV shards would miss those entries; it is not supported with "
            "parallel.tensor_parallel_size > 1 (use spec=ngram, or spec=draft: its model runs unsharded on rank 0)"
        )
    if config.executor.cuda_graph_dry_run:
        raise ValueError("cuda_graph_dry_run is not supported with parallel.tensor_parallel_size > 1 (TP runs eagerly)")


def check_tensor_parallel(n: int, arch: ModelArch, model: str) -> None:
    """Raise if model `model`'s shape cannot be split over n ranks."""
    if n == 1:
        return
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    if heads % n or kv_heads % n:
        divisors = [d for d in range(1, kv_heads + 1) if not heads % d and not kv_heads % d]
        raise ValueError(
            f"parallel.tensor_parallel_size={n} must divide the model's {heads} query heads and {kv_heads} KV heads "
            f"(model {model!r}); sizes that do: {divisors}"
        )
    if arch.intermediate_size % n:
        raise ValueError(
            f"parallel.tensor_parallel_size={n} must divide the MLP width {arch.intermediate_size} (model {model!r})"
        )


def shard_arch(arch: ModelArch, n: int) -> ModelArch:
    """One rank's share of the shape: heads, KV heads and MLP width divided by n (what its KV cache holds)."""
    if n == 1:
        return arch
    return replace(
        arch,
        num_attention_heads=arch.num_attention_heads // n,
        num_key_value_heads=arch.num_key_value_heads // n,
        intermediate_size=arch.intermediate_size // n,
    )
