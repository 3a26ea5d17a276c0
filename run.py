"""Entry point: `python run.py [overrides]` (or `testbed-run [overrides]`, from any directory) assembles the
engine from the packaged config tree (experiments/conf, composed as the module `experiments.conf`) and runs
the chosen mode."""

import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from experiments.conf import CONFIG_PATH


# package data, not a folder next to this file: a non-editable install runs from any directory
@hydra.main(config_path=CONFIG_PATH, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict | None:
    from experiments.run.runner import build_engine
    from experiments.run.settings import run_settings
    from testbed.cluster.config import ClusterConfig
    from testbed.parallel.worker import serve_if_worker

    if serve_if_worker():  # torchrun / srun rank > 0: a tensor-parallel worker of rank 0's engine
        return None

    try:  # every group checked first: a bad key or value is refused, naming it, before the run
        run_settings(cfg)
    except (ValueError, TypeError, KeyError) as e:
        _config_error(e)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    # mode=null: replay when a trace is given (trace=azure ...), else the built-in offline prompt set
    mode = cfg.mode or ("replay" if cfg.get("trace") else "offline")
    if mode not in ("offline", "replay", "serve", "route"):
        raise ValueError(f"unknown mode {cfg.mode!r}; one of offline, replay, serve, route")
    if mode == "route":  # an HTTP front end over testbed-serve backends: no engine here
        from testbed.cluster.http import serve_router

        return serve_router(cfg.cluster, cfg.server)
    if ClusterConfig.from_any(cfg.get("cluster")).enabled:  # N replicas behind a router
        if mode != "replay":
            raise ValueError(f"a cluster (cluster.replicas > 1 or P/D) replays a trace (trace=...), not mode={mode}")
        from experiments.cluster.runner import run_cluster

        return _interruptible(lambda: run_cluster(cfg, out_dir), out_dir)
    # the server's engine keeps the plain clock: a long-lived server would accumulate readings
    engine = build_engine(cfg, record_clock=mode != "serve")
    if mode == "replay":
        from experiments.run.runner import run_trace

        return _interruptible(lambda: run_trace(cfg, out_dir, engine), out_dir)
    if mode == "offline":
        from experiments.run.offline import run_offline

        return _interruptible(lambda: run_offline(engine, cfg.workload, out_dir, cfg), out_dir)
    from testbed.server import serve

    return serve(engine, cfg.server)


def _config_error(error: Exception) -> None:
    """A refused config as one line (exit 2); the traceback only with HYDRA_FULL_ERROR=1, as Hydra does."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise error
    print(f"config error: {error}", file=sys.stderr)
    sys.exit(2)


def _interruptible(run, out_dir: Path):
    try:
        return run()
    except KeyboardInterrupt as e:  # the runner has written what it measured (summary: interrupted)
        signum = getattr(e, "signum", signal.SIGINT)  # experiments.run.runner.RunInterrupted: which signal
        print(f"interrupted ({signal.Signals(signum).name}): partial results in {out_dir}", file=sys.stderr)
        sys.exit(128 + signum)


if __name__ == "__main__":
    main()
