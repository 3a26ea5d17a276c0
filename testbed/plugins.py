"""A part chosen by name: a built-in of a registry, or the import path of the user's own class.

Every registry of interchangeable parts (scheduler policies, KV allocators, eviction orders, routers) maps
names to "module:Class" and accepts such a path in place of a name, so `scheduler.name=mylab.policies:Mine`
plugs in a policy from the user's own directory (on sys.path) without forking, built and given its options
exactly as a built-in (vLLM's --scheduler-cls is the precedent). Hydra's `_target_` spelling of the same
path, `mylab.policies.Mine`, is taken too (the longest importable prefix is the module, as Hydra reads it).
"""

from __future__ import annotations

import importlib
import inspect
from typing import TypeVar

T = TypeVar("T")


def load_class(kind: str, registry: dict[str, str], name: str, base: type[T]) -> type[T]:
    """The class registered as `name`, or the one at the import path `name` ("package.module:Class", or
    Hydra's `_target_` spelling "package.module.Class")."""
    if not isinstance(name, str):
        raise ValueError(f"{kind} must be a name or an import path module:Class, got {name!r}")
    target = registry.get(name)
    if target is None:
        if not is_import_path(name):
            raise ValueError(
                f"unknown {kind} {name!r}; choose one of {sorted(registry)} or give an import path module:Class"
            )
        target = name if ":" in name else _colon_form(name)
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{kind} {name!r}: cannot import {module_name!r} ({e}); is its folder on sys.path?") from e
    obj: object = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"{kind} {name!r}: module {module_name!r} has no {attr!r}")
    if not isinstance(obj, type) or not issubclass(obj, base):
        expected = "a class" if base is object else f"a subclass of {base.__module__}.{base.__name__}"
        raise ValueError(f"{kind} {name!r}: {obj!r} is not {expected}")
    return obj


def is_import_path(name: object) -> bool:
    """Whether `name` is spelled as an import path ("module:Class" or `_target_`'s "module.Class")."""
    return isinstance(name, str) and (":" in name or "." in name)


def _colon_form(target: str) -> str:
    """ "a.b.C" -> "a.b:C": the longest prefix that imports is the module (an import failing inside it is
    raised by the caller's import, naming the real cause)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and (module_name + ".").startswith(e.name + "."):
                continue  # this prefix is not a module: try a shorter one
        except ImportError:
            pass
        return f"{module_name}:{'.'.join(parts[i:])}"
    return f"{parts[0]}:{'.'.join(parts[1:])}"  # nothing imports: the error names the top package


def check_options(kind: str, name: str, target, options: dict, fixed: tuple[str, ...] = ()) -> None:
    """Refuse options `target` (a class or function) does not declare, naming them and the ones it takes;
    `fixed` are the arguments the builder passes itself."""
    signature = inspect.signature(target)
    params = signature.parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        known = [p.name for p in params if p.name not in fixed and p.kind is not p.VAR_POSITIONAL]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"{kind} {name!r} takes no options {unknown}; its options: {known or 'none'}")
    try:  # a required argument missing
        signature.bind(**{f: None for f in fixed if f in signature.parameters}, **options)
    except TypeError as e:
        raise ValueError(f"{kind} {name!r}: {e} (give it in its options)") from None
