"""Speculative decoding settings, spelled as vLLM's `speculative_config` dict."""

from dataclasses import dataclass, fields

from testbed.plugins import is_import_path

# method -> "module:Proposer subclass", imported on demand; a method may also be the import path of the
# user's own Proposer subclass (testbed.plugins), built from spec.options.
PROPOSERS = {
    "ngram": "testbed.spec.ngram:NgramProposer",
    "draft": "testbed.spec.draft:DraftModelProposer",
    "layerskip": "testbed.spec.draft:LayerSkipProposer",
}
METHODS = ("none", *PROPOSERS)
_ALIASES = {"draft_model": "draft", "prompt_lookup": "ngram", "[ngram]": "ngram", "self_speculative": "layerskip"}


@dataclass
class SpeculativeConfig:
    method: str = "none"  # none | ngram | draft | layerskip | module:Class (a testbed.spec.base.Proposer)
    num_speculative_tokens: int = 4  # k: drafts proposed per request per step
    prompt_lookup_max: int = 3  # ngram: longest suffix n-gram matched
    prompt_lookup_min: int = 1  # ngram: shortest suffix n-gram matched
    model: str | None = None  # draft: model name sharing the target's vocabulary
    num_layers: int | None = None  # layerskip: the target's first L layers; draft: keep only L layers
    options: dict | None = None  # a user's method (module:Class): its constructor's arguments

    def __post_init__(self):
        self.method = _ALIASES.get(self.method, self.method)
        if self.method not in METHODS and not is_import_path(self.method):
            raise ValueError(
                f"unknown speculative method {self.method!r}; choose one of {list(METHODS)} "
                "or give an import path module:Class"
            )
        if self.options and self.method in METHODS:
            raise ValueError(f"speculative method {self.method!r} takes no options {sorted(self.options)}")
        if self.method == "none":
            return
        proposer_class(self.method, self.options or {})  # an import path that fails or a wrong option: refused now
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.method == "ngram" and not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )
        if self.method == "draft" and not self.model:
            raise ValueError("speculative method 'draft' needs a draft model: {'model': NAME}")
        if self.method == "layerskip" and self.num_layers is None:
            raise ValueError("speculative method 'layerskip' needs {'num_layers': L}")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @classmethod
    def from_any(cls, value) -> "SpeculativeConfig":
        """None, a SpeculativeConfig or a dict (unknown keys are an error; None values mean default)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"speculative_config must be a dict, got {type(value).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"unknown speculative_config keys {unknown}; known: {sorted(names)}")
        kwargs = {k: v for k, v in value.items() if v is not None}
        if "method" not in kwargs:
            kwargs["method"] = "draft" if kwargs.get("model") else "none"
        return cls(**kwargs)


def proposer_class(method: str, options: dict | None = None):
    """The Proposer class of `method` (a name or module:Class); a user's options checked unless None."""
    from testbed.plugins import check_options, load_class
    from testbed.spec.base import Proposer

    cls = load_class("speculative method", PROPOSERS, method, Proposer)
    if method not in PROPOSERS and options is not None:
        check_options("speculative method", method, cls, options)
    return cls
