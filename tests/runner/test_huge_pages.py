"""A run's records are tabled without numpy's huge-page advice (experiments.run.huge_pages), for one engine and
a cluster; numpy's setting comes back after, also when the block fails."""

import pytest
from hydra import compose, initialize_config_module

import experiments.cluster.runner as cluster_runner
import experiments.run.runner as runner
from experiments.run.huge_pages import madvise_switch, numpy_small_pages


def advised() -> bool:
    """numpy's huge-page advice now (read by setting it to itself)."""
    switch = madvise_switch()
    assert switch is not None  # the numpy this project runs on has it
    state = switch(True)
    switch(state)
    return state


def test_the_block_turns_the_advice_off_and_back():
    switch = madvise_switch()
    assert switch is not None
    original = advised()
    try:
        for before in (True, False):
            switch(before)
            with numpy_small_pages():
                assert advised() is False
            assert advised() is before
        switch(True)
        with pytest.raises(RuntimeError), numpy_small_pages():
            raise RuntimeError("a failed run")
        assert advised() is True
    finally:
        switch(original)


@pytest.mark.parametrize("module, cluster", [(runner, False), (cluster_runner, True)], ids=["engine", "cluster"])
def test_a_run_tables_its_records_without_the_advice(tmp_path, monkeypatch, module, cluster):
    seen = []
    real = module.run_summary

    def noting(*args, **kwargs):
        seen.append(advised())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "run_summary", noting)
    switch = madvise_switch()
    assert switch is not None
    before = switch(True)
    overrides = ["executor=sim", "device=h100-sxm", "model=llama-3.1-8b", "progress=false", "wandb.enabled=false"]
    overrides += ["trace=azure", "trace.max_requests=20", "replay=open_loop"]
    overrides += ["cluster.replicas=2"] if cluster else []
    try:
        with initialize_config_module(config_module="experiments.conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        if cluster:
            cluster_runner.run_cluster(cfg, tmp_path / "run")
        else:
            runner.run_trace(cfg, tmp_path / "run")
        assert seen == [False]
        assert advised() is True
    finally:
        switch(before)
