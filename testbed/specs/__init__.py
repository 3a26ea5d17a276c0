"""The built-in spec sheets: devices, KV transfer links and model shapes, one YAML file per name.

These files are the one source of both ways in: Hydra composes them as the `device`, `link` and `model`
config groups (conf/config.yaml puts this package on its search path), and the library reads a file here
only when it is given a bare name (`LLM(model="llama-3.2-1b")`, `sim_config={"device": "h100-sxm"}`).
A composed run passes the values (with every override applied), never a name to look up again.
"""

from __future__ import annotations

from importlib import resources

import yaml

GROUPS = ("device", "link", "model")


def builtin_names(group: str) -> list[str]:
    """Names with a spec file in `group` (shipped as package data, so a non-editable install has them)."""
    folder = resources.files(__name__) / group
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def builtin_spec(group: str, name: str) -> dict | None:
    """The mapping in `group`/`name`.yaml, or None when there is no such built-in."""
    if group not in GROUPS:
        raise ValueError(f"no built-in group {group!r}; one of {GROUPS}")
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        return None
    path = resources.files(__name__) / group / f"{name}.yaml"
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text()) or {}
