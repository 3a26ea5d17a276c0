import os
import sys

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
# kernel=auto means the torch reference in tests: exact token comparisons across schedules, batch sizes
# and preemption hold for it (the fast kernels are tested where a test names them)
os.environ.setdefault("TESTBED_KERNEL", "torch")
# Triton kernels run on the CPU through the interpreter; it must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.manual_seed(0)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: more intra-op threads (here or in the processes tests start)
    # would only spin against the other worker's
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

SHARED_TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces")


@pytest.fixture(scope="session")
def smollm2_folder():
    from testbed.models.smollm2 import ensure_smollm2_folder

    return ensure_smollm2_folder()


@pytest.fixture(scope="session")
def tokenizer(smollm2_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_folder):
    """Hugging Face transformers' SmolLM2-135M (float32, eval): the reference several tests compare with,
    loaded once."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Small ops on a shared 2-core machine: intra-op threads only spin against each other.
    Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def researcher_folder(tmp_path, monkeypatch):
    """tmp_path on sys.path, as a researcher's own folder of plugins. Several tests write a package of the
    same name (mylab) with different contents, so what this one imported from it is forgotten after it: the
    next test, in the same worker process, imports its own."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    tops = {p.stem for p in tmp_path.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    for name in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[name]
