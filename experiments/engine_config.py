"""Map a Hydra config onto the engine's EngineConfig (the one place that knows both shapes)."""

from omegaconf import DictConfig, OmegaConf

from testbed.config import EngineConfig


def engine_config_from_cfg(cfg: DictConfig) -> EngineConfig:
    sched, cache = cfg.scheduler, cfg.cache
    options = OmegaConf.to_container(sched.options, resolve=True) if sched.get("options") else {}
    return EngineConfig(
        model=cfg.model.name,
        hf_config=_plain(cfg.model.get("hf_config")),
        kernel=cfg.kernel.name,
        scheduler=sched.name,
        scheduler_options=options,
        cache=cache.get("name", "paged"),
        eviction=cache.get("eviction", "lru"),
        preemption_mode=cache.get("preemption_mode", "recompute"),
        swap_space_gb=cache.get("swap_space_gb", 1.0),
        num_cpu_blocks=cache.get("num_cpu_blocks", None),
        block_size=cache.block_size,
        num_blocks=cache.num_blocks,
        kv_cache_memory_gb=cache.memory_gb,
        kv_cache_dtype=cache.get("dtype", "auto"),
        gpu_memory_utilization=cache.gpu_memory_utilization,
        enable_prefix_caching=cache.prefix_caching,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_num_seqs=sched.max_num_seqs,
        enable_chunked_prefill=sched.enable_chunked_prefill,
        max_model_len=cfg.max_model_len,
        dtype=cfg.dtype,
        device=cfg.device.get("torch_device"),
        seed=cfg.seed,
        speculative_config=_spec_config(cfg),
        executor=cfg.executor.name,
        sim_config=_sim_config(cfg),
        null_step_time_s=cfg.executor.get("step_time_s", 0.0),
        tensor_parallel_size=cfg.parallel.tensor_parallel_size,
        distributed_timeout_s=cfg.parallel.timeout_s,
    )


def _sim_config(cfg: DictConfig) -> dict | None:
    if cfg.executor.name != "sim":
        return None
    sim = OmegaConf.to_container(cfg.executor, resolve=True)
    sim.pop("name")
    sim["device"] = _plain(cfg.device)  # the spec sheet's values, overrides applied
    return sim


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _spec_config(cfg: DictConfig) -> dict | None:
    spec = cfg.get("spec")
    if not spec or spec.get("method", "none") == "none":
        return None
    return OmegaConf.to_container(spec, resolve=True)
