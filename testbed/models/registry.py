"""Resolve a model name to (architecture config, where its weights come from, tokenizer folder).

A name is a built-in real model (`smollm2-135m`), a shape-only config in conf/model/ (random weights),
or a path to a Hugging Face model folder.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.models.smollm2 import ensure_smollm2_folder

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODEL_CONF_DIR = PROJECT_ROOT / "conf" / "model"
BUILTIN = {"smollm2-135m": ensure_smollm2_folder}


@dataclass
class ResolvedModel:
    name: str
    hf_config: dict
    weights_folder: Path | None  # None = seeded random weights
    tokenizer_folder: Path | None


def _shape_configs() -> dict[str, dict]:
    out = {}
    for file in sorted(MODEL_CONF_DIR.glob("*.yaml")):
        out[file.stem] = yaml.safe_load(file.read_text()) or {}
    return out


def resolve_model(name: str) -> ResolvedModel:
    if name in BUILTIN:
        folder = BUILTIN[name]()
        return ResolvedModel(name, json.loads((folder / "config.json").read_text()), folder, folder)
    shapes = _shape_configs()
    if name in shapes:
        conf = shapes[name]
        if conf.get("builtin"):
            return resolve_model(conf["builtin"])
        if "hf_config" not in conf:
            raise ValueError(f"{MODEL_CONF_DIR / (name + '.yaml')}: needs `hf_config` or `builtin`")
        return ResolvedModel(name, dict(conf["hf_config"]), None, None)
    path = Path(name).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.exists():
            raise FileNotFoundError(f"{path} is not a Hugging Face model folder: config.json is missing")
        has_tokenizer = any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
        return ResolvedModel(path.name, json.loads(config_file.read_text()), path, path if has_tokenizer else None)
    known = sorted(set(BUILTIN) | set(shapes))
    raise ValueError(f"unknown model {name!r}: not a built-in or conf/model name ({', '.join(known)}) and not a folder")
