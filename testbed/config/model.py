"""The model group: which model, its shape overrides, its tokenizer, dtype and context (vLLM's ModelConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.fields import flat
from testbed.typecheck import check_field_types
from testbed.validation import is_int

DTYPES = ("float32", "float16", "bfloat16")
# the config.json sizes testbed.models.arch.ModelArch reads as counts (those that may be null: it derives them)
SHAPE_COUNTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "max_position_embeddings")  # fmt: skip
SHAPE_COUNTS_OR_NULL = ("num_key_value_heads", "head_dim")


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
        for key, value in (self.hf_config or {}).items():
            nullable = key in SHAPE_COUNTS_OR_NULL
            if (key in SHAPE_COUNTS or nullable) and not (is_int(value) and value >= 1 or nullable and value is None):
                what = "null or an integer >= 1" if nullable else "an integer >= 1"
                raise ValueError(f"hf_config: {key} must be {what}, got {value!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        mml = self.max_model_len
        if mml is not None and (not is_int(mml) or mml < 1):
            raise ValueError(f"max_model_len must be null (the model's own) or an integer >= 1, got {mml!r}")
