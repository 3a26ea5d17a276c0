"""Triton KV write, RMSNorm, rotary and SiLU-and-mul vs their torch references."""

import pytest
import torch

from testbed_kernels import reference
from testbed_kernels.triton_kv_write import write_kv
from testbed_kernels.triton_rms_norm import rms_norm
from testbed_kernels.triton_rotary import rotary
from testbed_kernels.triton_silu_mul import silu_and_mul

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(*shape, dtype, device, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [8, 16, 64])
def test_write_kv(device, dtype, block_size):
    num_tokens, kv_heads, head_dim, num_blocks = 9, 3, 64, 4
    # k/v as strided views of a fused qkv buffer, as the model produces them
    qkv = randn(num_tokens, 2 + 2 * kv_heads, head_dim, dtype=dtype, device=device)
    key, value = qkv[:, 2 : 2 + kv_heads], qkv[:, 2 + kv_heads :]
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[1, 5]] = -1  # padding tokens
    slots = slots.to(device)
    caches = [
        torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
        for _ in range(4)
    ]
    write_kv(key, value, caches[0], caches[1], slots)
    reference.write_kv_ref(key, value, caches[2], caches[3], slots)
    # NaN marks untouched slots: equal_nan checks nothing was written for -1 or elsewhere
    assert torch.allclose(caches[0], caches[2], rtol=0, atol=0, equal_nan=True)
    assert torch.allclose(caches[1], caches[3], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96, 256])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(device, assert_close, dtype, hidden, with_residual):
    x = randn(3, 5, hidden, dtype=dtype, device=device)
    weight = randn(hidden, dtype=dtype, device=device, seed=1)
    residual = randn(3, 5, hidden, dtype=dtype, device=device, seed=2) if with_residual else None
    x_before = x.clone()
    out = rms_norm(x, weight, 1e-6, residual)
    ref = reference.rms_norm_ref(x.cpu(), weight.cpu(), 1e-6, None if residual is None else residual.cpu())
    assert torch.equal(x, x_before)  # inputs untouched
    if with_residual:
        assert isinstance(out, tuple)
        assert_close(out[0].cpu(), ref[0])
        assert_close(out[1].cpu(), ref[1])
    else:
        assert_close(out.cpu(), ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 80, 1500])
def test_silu_and_mul(device, assert_close, dtype, d):
    x = randn(4, 3, 2 * d, dtype=dtype, device=device)
    assert_close(silu_and_mul(x).cpu(), reference.silu_and_mul_ref(x.cpu()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("inplace", [False, True])
def test_rotary(device, assert_close, dtype, head_dim, inplace):
    num_tokens, heads, kv_heads, max_pos = 7, 6, 2, 64
    qkv = randn(num_tokens, heads + 2 * kv_heads, head_dim, dtype=dtype, device=device)
    q, k = qkv[:, :heads], qkv[:, heads : heads + kv_heads]  # strided views
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)
    positions = torch.randint(0, max_pos, (num_tokens,)).to(device)
    q_ref, k_ref = reference.rotary_ref(positions.cpu(), q.cpu(), k.cpu(), cache.cpu())
    q_out, k_out = rotary(positions, q, k, cache, inplace=inplace)
    assert_close(q_out.cpu(), q_ref)
    assert_close(k_out.cpu(), k_ref)
    if inplace:
        assert q_out.data_ptr() == q.data_ptr() and torch.equal(qkv[:, :heads], q_out)
    else:
        assert not torch.equal(q.cpu(), q_ref)  # inputs not rotated
