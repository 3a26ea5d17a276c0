"""A researcher's own part, by import path, without forking: a policy file outside the repository runs
through `run.py scheduler.name=mylab.policies:DeadlineFirst` (as the README shows), its options checked as
a built-in's; routers, allocators and eviction orders take import paths the same way."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from experiments.run.runner import build_engine
from testbed.cluster.config import ClusterConfig
from testbed.cluster.routers import get_router
from testbed.core.allocators import get_allocator
from testbed.core.policies import get_policy

from ..cluster.helpers import cfg

ROOT = Path(__file__).resolve().parents[2]
POLICY = '''
from testbed.core.policies.base import SchedulingPolicy


class DeadlineFirst(SchedulingPolicy):
    """Earliest deadline first: a request is due slack_s seconds per output token after it arrives."""

    name = "deadline_first"

    def __init__(self, slack_s: float = 0.05):
        if slack_s <= 0:
            raise ValueError(f"slack_s must be > 0, got {slack_s}")
        self.slack_s = slack_s

    def key(self, request, now):
        due = request.arrival_time + self.slack_s * request.sampling_params.max_tokens
        return (due, request.arrival_time, request.seq_no)
'''
PARTS = '''
from testbed.cluster.routers.round_robin import RoundRobinRouter
from testbed.core.block_pool import FreeBlockQueue
from testbed.core.allocators.paged import PagedAllocator


class EveryOther(RoundRobinRouter):
    def __init__(self, seed=0, stride: int = 2):
        super().__init__(seed=seed)
        self.stride = stride


class MRUQueue(FreeBlockQueue):
    pass


class MyPaged(PagedAllocator):
    pass


class NotAPolicy:
    pass
'''


def write_package(folder: Path, **modules: str) -> None:
    (folder / "mylab").mkdir()
    (folder / "mylab" / "__init__.py").write_text("")
    for name, text in modules.items():
        (folder / "mylab" / f"{name}.py").write_text(textwrap.dedent(text))


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *overrides, "progress=false"],
        cwd=tmp_path,  # outside the repository
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


WORKLOAD = [
    "model=tiny",
    "executor=host",  # the host executor: the scheduler alone decides the order
    "trace=synthetic",
    "trace.num_requests=6",
    "trace.rate=null",
    "trace.prompt_len={dist:fixed,value:8}",
    "trace.output_len={dist:uniform,low:2,high:40}",
    "scheduler.max_num_seqs=1",
]


def test_a_policy_from_the_users_own_folder_runs_and_decides(researcher_folder):
    tmp_path = researcher_folder
    write_package(tmp_path, policies=POLICY)
    out = tmp_path / "run"
    proc = run(
        tmp_path,
        *WORKLOAD,
        "scheduler.name=mylab.policies:DeadlineFirst",
        "+scheduler.options.slack_s=0.01",
        f"hydra.run.dir={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = pd.read_parquet(out / "requests.parquet").sort_values("first_token_time")
    # all arrive together: earliest deadline = fewest output tokens first (not arrival order)
    assert list(requests["target_output_tokens"]) == sorted(requests["target_output_tokens"])
    assert list(requests["target_output_tokens"]) != list(requests.sort_index()["target_output_tokens"])  # trace order
    assert "mylab.policies:DeadlineFirst" in (out / "config.yaml").read_text()

    # its options refused as a built-in's, by build_engine (what run.py calls after the run above), in this
    # process: two more run.py start-ups would check nothing more
    policy = [*WORKLOAD, "scheduler.name=mylab.policies:DeadlineFirst"]
    with pytest.raises(TypeError, match="slak_s"):
        build_engine(cfg(*policy, "+scheduler.options.slak_s=1"))
    with pytest.raises(ValueError, match="slack_s must be > 0"):
        build_engine(cfg(*policy, "+scheduler.options.slack_s=-1"))


def test_routers_allocators_and_eviction_take_import_paths(researcher_folder):
    write_package(researcher_folder, parts=PARTS)
    router = get_router("mylab.parts:EveryOther", seed=1, stride=3)
    assert type(router).__name__ == "EveryOther" and router.stride == 3
    with pytest.raises(ValueError, match="takes no options"):
        get_router("mylab.parts:EveryOther", strid=3)
    assert ClusterConfig(router="mylab.parts:EveryOther").router == "mylab.parts:EveryOther"
    with pytest.raises(ValueError, match=r"cluster.router: .*no 'Nope'"):
        ClusterConfig(router="mylab.parts:Nope")
    kv = get_allocator("mylab.parts:MyPaged", 8, 16, eviction="mylab.parts:MRUQueue", max_model_len=128)
    assert type(kv).__name__ == "MyPaged" and type(kv.pool.free_queue).__name__ == "MRUQueue"
    with pytest.raises(ValueError, match="is not a subclass of testbed.core.policies.base.SchedulingPolicy"):
        get_policy("mylab.parts:NotAPolicy")
    with pytest.raises(ValueError, match="cannot import 'nolab.x'"):
        get_policy("nolab.x:Y")


def test_hydras_target_spelling_of_an_import_path(researcher_folder):
    """`mylab.parts.EveryOther` (as Hydra's `_target_` writes it) is the same class as `mylab.parts:EveryOther`."""
    write_package(researcher_folder, parts=PARTS, broken="import not_installed_anywhere\n")
    router = get_router("mylab.parts.EveryOther", seed=1, stride=3)
    assert type(router).__name__ == "EveryOther" and router.stride == 3
    kv = get_allocator("mylab.parts.MyPaged", 8, 16, eviction="mylab.parts.MRUQueue", max_model_len=128)
    assert type(kv).__name__ == "MyPaged" and type(kv.pool.free_queue).__name__ == "MRUQueue"
    with pytest.raises(ValueError, match=r"module 'mylab.parts' has no 'Nope'"):
        get_policy("mylab.parts.Nope")
    with pytest.raises(ValueError, match="cannot import 'nolab'"):
        get_policy("nolab.x.Y")
    with pytest.raises(ValueError, match="not_installed_anywhere"):  # the real cause, not a shorter prefix
        get_policy("mylab.broken.Policy")
