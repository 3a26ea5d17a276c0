"""ModelArch.from_hf_config: rope_theta, where a config.json keeps it and when it is null."""

import pytest

from testbed.models.arch import ModelArch

BASE = dict(
    model_type="llama",
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
)


def test_rope_theta_from_the_top_level_or_rope_parameters():
    assert ModelArch.from_hf_config({**BASE, "rope_theta": 500000.0}).rope_theta == 500000.0
    nested = {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert ModelArch.from_hf_config(nested).rope_theta == 1e6
    assert ModelArch.from_hf_config(BASE).rope_theta == 10000.0


def test_null_rope_theta_is_a_clear_error():
    with pytest.raises(ValueError, match="rope_theta: null"):
        ModelArch.from_hf_config({**BASE, "rope_theta": None})
