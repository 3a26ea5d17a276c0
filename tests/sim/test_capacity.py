"""The roofline plan's KV capacity subtracts every weight the device holds, the embedding table included."""

import dataclasses

import pytest
import torch

from testbed.attention.backend import KernelBackend
from testbed.config import EngineConfig
from testbed.models.build import load_model_spec
from testbed.models.llama import LlamaForCausalLM
from testbed.sim.build import plan_simulation
from testbed.sim.capacity import weight_params
from testbed.sim.cost_models.roofline import RooflineCost
from testbed.sim.devices import load_device


@pytest.mark.parametrize("model", ["tiny", "qwen3-0.6b"])
@pytest.mark.parametrize("tied", [True, False])
def test_weight_params_equal_the_real_models_parameters(model, tied):
    """The count equals the parameters of the model the real engine builds (tied tables counted once); built
    on the meta device, as the engine builds it before loading weights (shapes only: no memory, no init)."""
    arch = dataclasses.replace(load_model_spec(model).arch, tie_word_embeddings=tied)
    if model != "tiny":  # qwen3-0.6b: its shape, shrunk to two layers so it builds in a moment
        arch = dataclasses.replace(arch, num_hidden_layers=2)
    with torch.device("meta"):
        real = LlamaForCausalLM(arch, KernelBackend(), max_positions=16)
    assert weight_params(arch) == sum(p.numel() for p in real.parameters())


def test_published_parameter_counts():
    assert weight_params(load_model_spec("llama-3.1-8b").arch) == 8_030_261_248  # untied: two 128256 x 4096 tables
    assert weight_params(load_model_spec("llama-3.2-1b").arch) == 1_235_814_400  # tied


def test_roofline_kv_capacity_subtracts_the_input_embedding():
    config = EngineConfig(
        model="llama-3.1-8b", executor="sim", sim_config={"cost_model": "roofline", "device": "h100-sxm"}
    )
    plan = plan_simulation(config)
    arch = load_model_spec("llama-3.1-8b").arch
    blocks = plan.num_blocks(arch, 16, 0.9, 1.0)
    per_block = arch.kv_bytes_per_token(2) * 16
    budget = 80 * 2**30 * 0.9 - 8_030_261_248 * 2
    assert blocks == int(budget // per_block)
    read_per_step = RooflineCost(arch, 2, load_device("h100-sxm")).weight_bytes
    embedding = arch.vocab_size * arch.hidden_size * 2
    # the blocks the embedding table (1.05 GB) would have given if it were counted as free KV memory
    assert int((budget + embedding) // per_block) - blocks >= embedding // per_block
    assert 8_030_261_248 * 2 - read_per_step >= embedding  # the per-step read excludes the table; capacity not
