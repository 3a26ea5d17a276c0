"""Resolve a model into (architecture config, where its weights come from, tokenizer folder).

A model is named: a built-in real model (`smollm2-135m`), a built-in shape (testbed/specs/model/NAME.yaml:
random weights) or a path to a Hugging Face model folder. `hf_config` carries values over the named
model's own config (vLLM's hf_overrides); a composed run passes the model group's whole `hf_config`,
so its overrides are what runs. A name that is none of the above takes `hf_config` as its whole config.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from testbed.models.smollm2 import ensure_smollm2_folder
from testbed.specs import builtin_names, builtin_spec

BUILTIN = {"smollm2-135m": ensure_smollm2_folder}


@dataclass
class ResolvedModel:
    name: str
    hf_config: dict
    weights_folder: Path | None  # None = seeded random weights
    tokenizer_folder: Path | None


def known_models() -> list[str]:
    return sorted(set(BUILTIN) | {n for n in builtin_names("model") if "hf_config" in (builtin_spec("model", n) or {})})


def resolve_model(name: str, hf_config: dict | None = None) -> ResolvedModel:
    if hf_config is not None and not isinstance(hf_config, dict):
        raise ValueError(f"hf_config must be a mapping of config.json keys, got {hf_config!r}")
    over = dict(hf_config or {})
    if name in BUILTIN:
        folder = BUILTIN[name]()
        return ResolvedModel(name, {**json.loads((folder / "config.json").read_text()), **over}, folder, folder)
    shape = builtin_spec("model", name)
    if shape is not None and "hf_config" in shape:
        return ResolvedModel(name, {**shape["hf_config"], **over}, None, None)
    path = Path(name).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.exists():
            raise FileNotFoundError(f"{path} is not a Hugging Face model folder: config.json is missing")
        has_tokenizer = any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
        config = {**json.loads(config_file.read_text()), **over}
        return ResolvedModel(path.name, config, path, path if has_tokenizer else None)
    if over:  # a shape of the caller's own (e.g. a model group of a user's conf/)
        return ResolvedModel(name, over, None, None)
    raise ValueError(
        f"unknown model {name!r}: not a built-in ({', '.join(known_models())}), not a folder, and no hf_config given"
    )
