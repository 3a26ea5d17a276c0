"""Executor kinds (testbed.executor_kinds): the engine, the cluster and the runner ask the kind instead of
branching on its name, a researcher's own kind plugs in by import path, and testbed/executor never reaches
into testbed/sim."""

import ast
import json
import textwrap
from pathlib import Path

import pytest

from experiments.run.runner import executor_summary, run_trace
from testbed import Engine
from testbed.config import EngineConfig
from testbed.sampling_params import SamplingParams

from ..cluster.helpers import cfg

ROOT = Path(__file__).resolve().parents[2]
KIND = """
from testbed.executor.kind import HostKind


class FixedBlocks(HostKind):
    '''The host executor on a KV cache of exactly 37 blocks, naming itself in the summary.'''

    name = "fixed_blocks"

    def num_blocks(self, arch, kv_dtype):
        return 37

    def summary(self, executor):
        return {"fixed_blocks_steps": executor.steps}

    def build(self, spec, sampler, num_blocks, num_cpu_blocks, block_bytes):
        parts = super().build(spec, sampler, num_blocks, num_cpu_blocks, block_bytes)
        executor = parts.executor
        executor.steps = 0
        execute = executor.execute

        def counted(out):
            executor.steps += 1
            return execute(out)

        executor.execute = counted
        return parts
"""


@pytest.fixture
def mylab(researcher_folder):
    """A researcher's package outside the repo."""
    (researcher_folder / "mylab").mkdir()
    (researcher_folder / "mylab" / "__init__.py").write_text("")
    (researcher_folder / "mylab" / "kinds.py").write_text(textwrap.dedent(KIND))
    return researcher_folder


def test_a_users_kind_sizes_the_kv_cache_builds_and_summarises(mylab):
    engine = Engine(EngineConfig(model="tiny", executor="mylab.kinds:FixedBlocks", kernel="torch"))
    assert engine.kv.num_blocks == 37
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert len(outputs[-1].outputs[0].token_ids) == 5
    assert executor_summary(engine) == {
        "executor": "mylab.kinds:FixedBlocks",
        "kernel": "torch",
        "fixed_blocks_steps": engine.step_count,
    }


def test_a_users_kind_runs_from_the_composed_config(mylab, tmp_path):
    out = tmp_path / "run"
    run_trace(
        cfg(
            "model=tiny",
            "kernel=torch",
            "executor.name=mylab.kinds:FixedBlocks",
            "trace=synthetic",
            "trace.num_requests=3",
            "trace.prompt_len={dist:fixed,value:8}",
            "trace.output_len={dist:fixed,value:4}",
        ),
        out,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["executor"] == "mylab.kinds:FixedBlocks"
    assert summary["fixed_blocks_steps"] >= 4  # each request's 4 tokens take a step at least


def test_a_kind_refuses_the_keys_it_does_not_read():
    with pytest.raises(ValueError, match="executor.step_time_s: not a setting of executor 'real'"):
        from experiments.run.engine_config import engine_config_from_cfg

        engine_config_from_cfg(cfg("model=tiny", "+executor.step_time_s=0.1"))


def test_built_in_kinds_summaries():
    host = Engine(EngineConfig(model="tiny", executor="host", kernel="torch", num_blocks=64))
    assert executor_summary(host) == {"executor": "host", "kernel": "torch"}
    sim = Engine(EngineConfig(model="tiny", executor="sim", num_blocks=64, sim_config={"device": "h100-sxm"}))
    assert executor_summary(sim)["sim_cost_model"] == "roofline"


def test_the_old_name_null_is_refused_naming_host():
    with pytest.raises(ValueError, match="executor 'null' is named 'host'"):
        EngineConfig(model="tiny", executor="null")


def test_a_class_that_is_not_a_kind_is_refused():
    with pytest.raises(ValueError, match="not a subclass of testbed.executor.kind.ExecutorKind"):
        EngineConfig(model="tiny", executor="collections:OrderedDict")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_testbed_executor_never_imports_testbed_sim():
    for path in (ROOT / "testbed" / "executor").rglob("*.py"):
        assert not [m for m in _imports(path) if m.startswith("testbed.sim")], path


def test_nothing_in_testbed_branches_on_the_executor_kinds_name():
    """`config.executor == "sim"` and the like: the kind answers instead (testbed.executor.kind)."""
    found = []
    for path in (ROOT / "testbed").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "executor" for s in sides):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found
