"""Entry point: `python run.py [overrides]` assembles the engine from conf/ and runs the chosen mode."""
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from experiments.engine_config import engine_config_from_cfg
    from testbed import Engine

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    engine = Engine(engine_config_from_cfg(cfg))
    if cfg.mode == "offline":
        from experiments.offline import run_offline
        return run_offline(engine, cfg.workload, out_dir)
    raise ValueError(f"unknown mode {cfg.mode!r}")


if __name__ == "__main__":
    main()
