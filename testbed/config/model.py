"""The model group: which model, its shape overrides, its tokenizer, dtype and context (vLLM's ModelConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.fields import flat
from testbed.typecheck import check_field_types
from testbed.validation import is_int

DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class ModelConfig:
    name: str = flat("model", "smollm2-135m")  # built-in model or shape (testbed/specs/model/), or an HF folder path
    hf_config: dict | None = None  # values over the model's config.json / built-in shape (vLLM's hf_overrides)
    tokenizer: str | None = None  # another model's tokenizer (built-in name or HF folder); None: the model's
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on GPU
    max_model_len: int | None = None  # None: the model's max_position_embeddings

    def __post_init__(self):
        check_field_types(self)
        if self.hf_config == {}:  # no values over the model's own, one way (a sheet's `hf_config: {}`)
            self.hf_config = None
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        mml = self.max_model_len
        if mml is not None and (not is_int(mml) or mml < 1):
            raise ValueError(f"max_model_len must be null (the model's own) or an integer >= 1, got {mml!r}")
