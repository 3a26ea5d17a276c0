"""kernel=cpu: the C++ paged-decode kernel and the CPU backend vs the torch references, on fresh random inputs."""

import pytest
import torch

from testbed.attention.backend import AttentionMetadata, KernelBackend
from testbed_kernels.reference import paged_attention_ref


def cpu_paged_kv(paged_kv, *args, **kw):
    return [t.cpu() for t in paged_kv(*args, **kw)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("block_size,head_dim", [(8, 64), (16, 128), (5, 64), (256, 64)])
def test_paged_decode_matches_reference(cpu_kernels, paged_kv, assert_close, dtype, group, block_size, head_dim):
    # lengths that are not multiples of the block size, a single token, and one exactly on a block boundary
    ctx_lens = [1, 3 * block_size, 3 * block_size + 1, 77, 300]
    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(
        paged_kv, ctx_lens, block_size, 2, head_dim, dtype, seed=block_size + group
    )
    q = torch.randn(len(ctx_lens), 2 * group, head_dim).to(dtype)
    qsl = torch.arange(len(ctx_lens) + 1, dtype=torch.int32)
    scale = head_dim**-0.5
    ref = paged_attention_ref(q, k_cache, v_cache, qsl, seq_lens, tables, scale)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    assert cpu_kernels.paged_decode(q, k_cache, v_cache, seq_lens, tables, scale, out=out) is out
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group,head_dim", [(5, 40), (7, 96), (8, 80), (2, 8)])
def test_paged_decode_group_and_head_dim_tails(cpu_kernels, paged_kv, assert_close, dtype, group, head_dim):
    """The weighted sum of V works on query heads in sets of up to 4 and head_dim in chunks of up to 32
    floats: groups and head sizes that leave partial sets and chunks."""
    ctx_lens = [1, 17, 64, 150]
    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(paged_kv, ctx_lens, 16, 2, head_dim, dtype, seed=group)
    q = torch.randn(len(ctx_lens), 2 * group, head_dim).to(dtype)
    qsl = torch.arange(len(ctx_lens) + 1, dtype=torch.int32)
    ref = paged_attention_ref(q, k_cache, v_cache, qsl, seq_lens, tables, head_dim**-0.5)
    out = torch.full_like(q, float("nan"))
    assert_close(cpu_kernels.paged_decode(q, k_cache, v_cache, seq_lens, tables, head_dim**-0.5, out=out), ref)


def test_paged_decode_strided_query(cpu_kernels, paged_kv, assert_close):
    """q sliced out of a fused qkv projection (row stride > heads * head_dim) is read correctly."""
    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(paged_kv, [40, 9], 16, 3, 64, torch.float32)
    qkv = torch.randn(2, (9 + 6) * 64)
    q = qkv[:, : 9 * 64].view(2, 9, 64)
    assert not q.is_contiguous()
    ref = paged_attention_ref(q.contiguous(), k_cache, v_cache, torch.tensor([0, 1, 2]), seq_lens, tables, 0.125)
    assert_close(cpu_kernels.paged_decode(q, k_cache, v_cache, seq_lens, tables, 0.125), ref)


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
def test_paged_decode_narrow_kv_cache(cpu_kernels, paged_kv, assert_close, cache_dtype):
    """kv_cache_dtype: fp32 queries over a bf16/fp16 cache, accumulated in fp32 (the reference widens too)."""
    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(paged_kv, [1, 33, 200], 16, 2, 64, cache_dtype)
    q = torch.randn(3, 6, 64)
    ref = paged_attention_ref(q, k_cache, v_cache, torch.arange(4, dtype=torch.int32), seq_lens, tables, 0.125)
    out = cpu_kernels.paged_decode(q, k_cache, v_cache, seq_lens, tables, 0.125)
    assert out.dtype == torch.float32
    assert_close(out, ref)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_reference(cpu_kernels, cache_dtype):
    """Strided k/v (views of a fused projection) into their slots, padding (-1) slots untouched."""
    from testbed_kernels.reference import write_kv_ref

    shape = (6, 4, 2, 64)
    k_cache, v_cache = torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)
    kv = torch.randn(5, 4 * 64)
    k, v = kv[:, :128].view(5, 2, 64), kv[:, 128:].view(5, 2, 64)
    slots = torch.tensor([3, -1, 17, 0, 23])
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    write_kv_ref(k, v, ref_k, ref_v, slots)
    cpu_kernels.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_kernels.write_kv(k, v, k_cache, v_cache, torch.tensor([0, 1, 2, 3, 24]))


def test_decode_attention_is_write_then_decode(cpu_kernels, paged_kv):
    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(paged_kv, [17, 64, 5], 16, 1, 64, torch.float32)
    slots = torch.tensor([int(tables[i, (n - 1) // 16]) * 16 + (n - 1) % 16 for i, n in enumerate([17, 64, 5])])
    q, k, v = torch.randn(3, 4, 64), torch.randn(3, 1, 64), torch.randn(3, 1, 64)
    kc, vc = k_cache.clone(), v_cache.clone()
    cpu_kernels.write_kv(k, v, kc, vc, slots)
    ref = cpu_kernels.paged_decode(q, kc, vc, seq_lens, tables, 0.125)
    out = cpu_kernels.decode_attention(q, k, v, k_cache, v_cache, slots, tables, seq_lens, 0.125)
    assert torch.equal(out, ref) and torch.equal(k_cache, kc) and torch.equal(v_cache, vc)


def test_paged_decode_rejects_bad_input(cpu_kernels, paged_kv):
    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(paged_kv, [10], 16, 2, 64, torch.float32)
    q = torch.randn(1, 4, 64)
    with pytest.raises(RuntimeError, match="share a dtype"):
        cpu_kernels.paged_decode(q, k_cache, v_cache, seq_lens, tables, 0.125, out=torch.empty_like(q).half())
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        cpu_kernels.paged_decode(q.double(), k_cache, v_cache, seq_lens, tables, 0.125)
    with pytest.raises(RuntimeError, match="batch sizes disagree"):
        cpu_kernels.paged_decode(torch.randn(2, 4, 64), k_cache, v_cache, seq_lens, tables, 0.125)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        kc, vc, t, s = cpu_paged_kv(paged_kv, [10], 16, 2, 12, torch.float32)
        cpu_kernels.paged_decode(torch.randn(1, 4, 12), kc, vc, s, t, 0.125)


def mixed_step(block_size, num_kv_heads, group, head_dim, dtype, seed):
    """A step mixing a fresh prompt, a chunk after a cached prefix, decodes, an idle sequence and a
    speculative-verification-sized chunk: new k/v not yet in the cache, as the model hands them over."""
    gen = torch.Generator().manual_seed(seed)
    q_lens = [9, 6, 1, 0, 1, 5]
    ctx_lens = [9, 6 + 2 * block_size + 3, 1, 4, 70, 33]
    max_blocks = max(-(-n // block_size) for n in ctx_lens)
    num_blocks = len(ctx_lens) * max_blocks + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: len(ctx_lens) * max_blocks].view(len(ctx_lens), -1)
    slots = [
        int(tables[i, p // block_size]) * block_size + p % block_size
        for i, (ql, cl) in enumerate(zip(q_lens, ctx_lens))
        for p in range(cl - ql, cl)
    ]
    n = sum(q_lens)
    q = torch.randn(n, num_kv_heads * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor([0] + q_lens).cumsum(0).int(),
        seq_lens=torch.tensor(ctx_lens, dtype=torch.int32),
        block_tables=tables.int(),
        max_query_len=max(q_lens),
        max_seq_len=max(ctx_lens),
    )
    return q, k, v, k_cache, v_cache, meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 3])
def test_cpu_backend_mixed_step_matches_reference(cpu_kernels, assert_close, dtype, group):
    from testbed.attention.cpu_backend import CpuBackend

    q, k, v, k_cache, v_cache, meta = mixed_step(16, 2, group, 64, dtype, seed=group)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    ref = KernelBackend().attention(q, k, v, ref_k, ref_v, meta, 0.125)
    out = CpuBackend().attention(q, k, v, k_cache, v_cache, meta, 0.125)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    assert_close(out, ref)


def test_cpu_backend_decode_only_step(cpu_kernels, paged_kv, assert_close):
    from testbed.attention.cpu_backend import CpuBackend

    k_cache, v_cache, tables, seq_lens = cpu_paged_kv(paged_kv, [17, 64, 5], 16, 1, 64, torch.float32)
    slots = torch.tensor([int(tables[i, (n - 1) // 16]) * 16 + (n - 1) % 16 for i, n in enumerate([17, 64, 5])])
    q, k, v = torch.randn(3, 4, 64), torch.randn(3, 1, 64), torch.randn(3, 1, 64)
    meta = AttentionMetadata(slots, torch.arange(4, dtype=torch.int32), seq_lens, tables, 1, 64)
    ref = KernelBackend().attention(q, k, v, k_cache.clone(), v_cache.clone(), meta, 0.125)
    assert_close(CpuBackend().attention(q, k, v, k_cache, v_cache, meta, 0.125), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_ops_match_reference(cpu_kernels, assert_close, dtype):
    from testbed_kernels import reference

    gen = torch.Generator().manual_seed(7)
    x, res = torch.randn(37, 576, generator=gen).to(dtype), torch.randn(37, 576, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(576, generator=gen)).to(dtype)
    assert_close(cpu_kernels.rms_norm(x, w, 1e-5), reference.rms_norm_ref(x, w, 1e-5))
    normed, summed = cpu_kernels.rms_norm(x, w, 1e-5, res)
    ref_normed, ref_summed = reference.rms_norm_ref(x, w, 1e-5, res)
    assert_close(normed, ref_normed)
    assert_close(summed, ref_summed)
    # q and k as strided views of one fused projection, positions out of order
    head_dim, max_pos = 64, 300
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
    qkv = torch.randn(11, (4 + 2 + 2) * head_dim, generator=gen).to(dtype)
    q, k, _ = qkv.split([4 * head_dim, 2 * head_dim, 2 * head_dim], dim=-1)
    q, k = q.view(11, 4, head_dim), k.view(11, 2, head_dim)
    positions = torch.randint(0, max_pos, (11,), generator=gen)
    for out, ref in zip(cpu_kernels.rotary(positions, q, k, cos_sin), reference.rotary_ref(positions, q, k, cos_sin)):
        assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_and_mul_matches_reference(cpu_kernels, assert_close, dtype):
    """Fresh random rows; widths that end in the 16-lane (AVX-512), the 8-lane and the scalar loop (29 = 16 + 8 +
    5); values far enough out to reach exp's clamps."""
    from testbed_kernels import reference

    gen = torch.Generator().manual_seed(11)
    for shape in [(37, 2 * 1536), (5, 2 * 13), (4, 2 * 29), (2, 3, 2 * 64)]:
        x = (torch.randn(*shape, generator=gen) * 8).to(dtype)
        x.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -0.0]).to(dtype)
        assert_close(cpu_kernels.silu_and_mul(x), reference.silu_and_mul_ref(x))


def test_build_name_follows_the_sources(tmp_path, monkeypatch):
    """Checkouts with different kernel sources get different builds; the same sources, the same build."""
    import testbed_kernels.cpu

    (tmp_path / "a.cpp").write_text("int f() { return 1; }\n")
    (tmp_path / "ops.h").write_text("int f();\n")
    monkeypatch.setattr(testbed_kernels.cpu, "__file__", str(tmp_path / "__init__.py"))
    first = testbed_kernels.cpu._build_tag()
    (tmp_path / "ops.h").write_text("int f(); int g();\n")
    assert testbed_kernels.cpu._build_tag() != first
    (tmp_path / "ops.h").write_text("int f();\n")
    assert testbed_kernels.cpu._build_tag() == first
