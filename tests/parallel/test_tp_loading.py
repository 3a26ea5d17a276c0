"""Each tensor-parallel rank loads only its own slices (in one process, no workers: a rank's build needs no
collective): the slices put back together are the whole model's weights, from seeded draws and from a
safetensors folder; a rank's peak memory while loading is about 1/N of the model's parameters."""

import dataclasses

import pytest
import torch
from safetensors.torch import save_file
from torch.profiler import ProfilerActivity, profile

from testbed.attention import get_backend
from testbed.models.build import ModelSpec, build_model, load_model_spec, whole_parameters
from testbed.models.weights import DRAW_CHUNK_ELEMENTS
from testbed.parallel.comm import TPGroup
from testbed.parallel.sharding import build_rank_model

CPU = torch.device("cpu")
OPS = get_backend("torch")
# tiny reshaped: q/k/v biases (qwen2), an untied LM head, and a vocabulary 3 ranks do not divide (padding rows)
QWEN2ISH = {"model_type": "qwen2", "tie_word_embeddings": False, "vocab_size": 4093, "num_key_value_heads": 6,
            "num_attention_heads": 12, "head_dim": 8, "intermediate_size": 96}  # fmt: skip


def ranks(spec: ModelSpec, n: int, seed: int = 3) -> list[dict[str, torch.Tensor]]:
    group = [TPGroup(r, n, CPU) for r in range(n)]
    return [dict(build_rank_model(spec, OPS, torch.float32, CPU, seed, g).named_parameters()) for g in group]


def put_together(name: str, parts: list[torch.Tensor], spec: ModelSpec) -> torch.Tensor:
    """The whole parameter from the ranks' slices, by the Megatron layout (restated here, not imported)."""
    arch, n = spec.arch, len(parts)
    if "o_proj" in name or "down_proj" in name:  # row parallel: input columns
        return torch.cat(parts, dim=1)
    if "embed_tokens" in name or "lm_head" in name:  # vocabulary rows, the last rank padded with zeros
        whole = torch.cat(parts)
        assert not whole[arch.vocab_size :].any()
        return whole[: arch.vocab_size]
    if "qkv_proj" in name:  # each rank: its query heads, then its KV heads' k, then v
        d = arch.head_dim
        sizes = [arch.num_attention_heads * d // n, arch.num_key_value_heads * d // n]
        split = [p.split([sizes[0], sizes[1], sizes[1]]) for p in parts]
        return torch.cat([torch.cat([s[i] for s in split]) for i in range(3)])
    if "gate_up_proj" in name:  # each rank: its gate rows, then its up rows
        split = [p.chunk(2) for p in parts]
        return torch.cat([torch.cat([s[i] for s in split]) for i in range(2)])
    assert "norm" in name, name  # replicated
    assert all(torch.equal(p, parts[0]) for p in parts)
    return parts[0]


def assert_slices_make_the_whole(whole: dict[str, torch.Tensor], shards: list[dict], spec: ModelSpec):
    assert [sorted(s) for s in shards] == [sorted(whole)] * len(shards)
    for name, param in whole.items():
        assert torch.equal(put_together(name, [s[name] for s in shards], spec), param), name


@pytest.mark.parametrize("model, hf, n", [("tiny", {}, 2), ("tiny", QWEN2ISH, 2), ("tiny", QWEN2ISH, 3)])
def test_seeded_slices_are_the_whole_models_weights(model, hf, n):
    spec = load_model_spec(model, 64, hf_config=hf)
    whole = dict(build_model(spec, OPS, torch.float32, CPU, seed=3).named_parameters())
    assert_slices_make_the_whole(whole, ranks(spec, n), spec)


def test_safetensors_slices_are_the_whole_models_weights(tmp_path):
    """A Hugging Face folder (q/k/v and gate/up unfused, two files) written from a whole model with non-trivial
    norms and biases; each rank reads its slices of it."""
    spec = load_model_spec("tiny", 64, hf_config=QWEN2ISH)
    model = build_model(spec, OPS, torch.float32, CPU, seed=5)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
    whole = {name: p.detach().clone() for name, p in model.named_parameters()}
    arch = spec.arch
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    inter = arch.intermediate_size
    hf = {}
    for name, t in whole.items():
        if "qkv_proj" in name:
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv])):
                hf[name.replace("qkv_proj", part)] = piece.contiguous()
        elif "gate_up_proj" in name:
            for part, piece in zip(("gate_proj", "up_proj"), t.split([inter, inter])):
                hf[name.replace("gate_up_proj", part)] = piece.contiguous()
        else:
            hf[name] = t.contiguous()
    names = sorted(hf)
    save_file({k: hf[k] for k in names[::2]}, str(tmp_path / "model-1.safetensors"))
    save_file({k: hf[k] for k in names[1::2]}, str(tmp_path / "model-2.safetensors"))
    from_files = dataclasses.replace(spec, weights_folder=tmp_path)
    assert_slices_make_the_whole(whole, ranks(from_files, 3), spec)


def peak_bytes(build) -> int:
    """The most bytes torch held on the CPU at once while `build` ran (allocations minus frees, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        build()
    held = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def test_a_ranks_peak_memory_is_about_one_nth_of_the_model():
    # a shape-only model big enough that a draw chunk (256 KiB) is small beside a rank's share
    hf = {"vocab_size": 4001, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32}  # fmt: skip
    spec, n = load_model_spec("tiny", 64, hf_config=hf), 4
    whole = whole_parameters(spec.arch, OPS)
    total = sum(shape.numel() * 4 for shape in whole.values())
    replicated = sum(shape.numel() * 4 for name, shape in whole.items() if "norm" in name)
    share = (total - replicated) / n
    # the last rank: its vocabulary rows padded
    peak = peak_bytes(lambda: build_rank_model(spec, OPS, torch.float32, CPU, 0, TPGroup(n - 1, n, CPU)))
    # at least its share (the measure sees the allocations), at most that and 3 draw chunks (not the model)
    assert share <= peak - replicated <= share * 1.02 + 3 * 4 * DRAW_CHUNK_ELEMENTS, (peak, share, total)
