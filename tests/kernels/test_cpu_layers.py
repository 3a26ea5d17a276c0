"""kernel=cpu's packed-weight linear kernel and its one-call decode layers, against torch and the Python layers."""

import pytest
import torch

from testbed.attention.backend import AttentionMetadata

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("rows", [1, 2, 5, 12, 13, 25, 128])
@pytest.mark.parametrize("out_features,in_features", [(960, 576), (577, 573), (5, 16), (33, 7)])
def test_linear_packed_matches_torch(cpu_kernels, rows, out_features, in_features):
    """Every row-tile count (full tiles and remainders) and output columns that fill no whole panel."""
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    x = torch.randn(rows, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen)
    packed = cpu_kernels.pack_linear(w)
    out = torch.ops.testbed_cpu.linear_packed(x, packed, out_features, b)
    ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
    assert out.dtype == torch.float32 and out.shape == (rows, out_features)
    assert ((out.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5
    assert torch.equal(out, torch.ops.testbed_cpu.linear_packed(x, packed, out_features, None) + b)


def test_linear_packed_is_batch_invariant(cpu_kernels):
    """A row's result does not depend on the other rows of its batch, nor on where in a tile it sits."""
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(29, 573, generator=gen), torch.randn(577, 573, generator=gen)
    packed = cpu_kernels.pack_linear(w)
    full = torch.ops.testbed_cpu.linear_packed(x, packed, 577, None)
    for i in range(29):
        assert torch.equal(torch.ops.testbed_cpu.linear_packed(x[i : i + 1], packed, 577, None)[0], full[i]), i
    assert torch.equal(torch.ops.testbed_cpu.linear_packed(x[5:20].contiguous(), packed, 577, None), full[5:20])


def test_linear_dispatch(cpu_kernels, monkeypatch):
    """Up to FEW_ROWS float32 rows with a packed copy take the kernel; more rows, other dtypes or no packed
    copy take torch's GEMM. Bad packed weights are named."""
    calls = []
    real = torch.ops.testbed_cpu.linear_packed
    monkeypatch.setattr(torch.ops.testbed_cpu, "linear_packed", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    w = torch.randn(8, 16)
    packed = cpu_kernels.pack_linear(w)
    cpu_kernels.linear(torch.randn(cpu_kernels.FEW_ROWS, 16), w, None, packed)
    cpu_kernels.linear(torch.randn(cpu_kernels.FEW_ROWS + 1, 16), w, None, packed)
    cpu_kernels.linear(torch.randn(3, 16), w)
    cpu_kernels.linear(torch.randn(2, 16, dtype=torch.bfloat16), w.bfloat16(), None, packed)
    assert calls == [cpu_kernels.FEW_ROWS]
    with pytest.raises(RuntimeError, match="float32 only"):
        real(torch.randn(2, 16).double(), packed, 8, None)
    with pytest.raises(RuntimeError, match="columns"):
        real(torch.randn(2, 15), packed, 8, None)
    with pytest.raises(RuntimeError, match="pack_linear"):
        real(torch.randn(2, 16), w, 8, None)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_kernels.pack_linear(w.double())


def test_backend_packs_each_weight_once(cpu_kernels, monkeypatch):
    """The backend keeps one packed copy per weight while the weight lives; none with the knob off."""
    import gc

    from testbed.attention.cpu_backend import CpuBackend

    backend = CpuBackend()
    w = torch.randn(40, 16)
    x = torch.randn(3, 16)
    first = backend.packed(w)
    assert backend.packed(w) is first and len(backend._packed) == 1
    assert torch.equal(backend.linear(x, w), torch.ops.testbed_cpu.linear_packed(x, first, 40, None))
    assert backend.packed(w.bfloat16()) is None
    del w
    gc.collect()
    assert backend._packed == {}
    monkeypatch.setenv("TESTBED_CPU_PACKED_WEIGHTS", "0")
    assert CpuBackend().packed(torch.randn(40, 16)) is None


def test_weights_are_packed_when_loaded(cpu_kernels):
    """process_weights_after_loading packs every linear weight (the LM head too), so no step does."""
    model, _ = _model("llama")
    model.ops.process_weights_after_loading(model)
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert len(linears) == 3 * 4 + 1 and set(model.ops._packed) == linears


def _model(model_type: str, dtype=torch.float32):
    """A small random model of the family: qwen2 has q/k/v biases, qwen3 per-head q/k norms."""
    from testbed.attention.cpu_backend import CpuBackend
    from testbed.models.arch import ModelArch
    from testbed.models.llama import LlamaForCausalLM
    from testbed.models.weights import init_random_weights

    arch = ModelArch.from_hf_config(
        dict(
            model_type=model_type,
            vocab_size=300,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rms_norm_eps=1e-5,
            max_position_embeddings=256,
        )
    )
    model = LlamaForCausalLM(arch, CpuBackend(), 256)
    init_random_weights(model, seed=1)
    with torch.no_grad():  # non-trivial biases and norm weights, so a wrong order would show
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    model = model.to(dtype).eval()
    model.build_rope_cache()
    return model, arch


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("num_seqs", [1, 3, 129])  # 129: more rows than FEW_ROWS, torch's GEMM inside
def test_decode_layers_equal_the_python_layers(cpu_kernels, model_type, num_seqs):
    """Hidden states and the written KV of a decode step are bit-identical with and without the one-call path."""
    from testbed.attention.cpu_backend import CpuBackend

    model, arch = _model(model_type)
    gen = torch.Generator().manual_seed(num_seqs)
    block_size, blocks_per_seq = 8, 4
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    caches = [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in range(3)]
    tables = torch.randperm(num_blocks, generator=gen).view(num_seqs, blocks_per_seq).int()
    seq_lens = torch.randint(1, block_size * blocks_per_seq, (num_seqs,), generator=gen).int()
    positions = (seq_lens - 1).long()
    slots = (tables[torch.arange(num_seqs), positions // block_size].long() * block_size) + positions % block_size
    meta = AttentionMetadata(
        slots, torch.arange(num_seqs + 1, dtype=torch.int32), seq_lens, tables, 1, int(seq_lens.max())
    )
    ids = torch.randint(0, arch.vocab_size, (num_seqs,), generator=gen)
    outs = {}
    for fused in (True, False):
        kv = [(k.clone(), v.clone()) for k, v in caches]
        if not fused:
            model.ops.decode_layers = lambda *a: None  # the instance attribute shadows the method
        with torch.inference_mode():
            outs[fused] = (model(ids, positions, kv, meta), kv)
    del model.ops.decode_layers
    assert isinstance(model.ops, CpuBackend)
    assert torch.equal(outs[True][0], outs[False][0])
    for (k1, v1), (k2, v2) in zip(outs[True][1], outs[False][1]):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
