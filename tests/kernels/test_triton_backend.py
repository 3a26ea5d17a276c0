"""TritonBackend through get_backend("triton"), against the torch KernelBackend on a prefill then decode step."""

import torch

from testbed.attention.backend import AttentionMetadata, get_backend


def meta_for(q_lens, ctx_lens, tables, slots, device):
    qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(ctx_lens, dtype=torch.int32).to(device),
        block_tables=tables.to(device),
        max_query_len=max(q_lens),
        max_seq_len=max(ctx_lens),
    )


def slots_of(tables, seq, positions, block_size):
    return [int(tables[seq, p // block_size]) * block_size + p % block_size for p in positions]


def test_backend_prefill_then_decode(device, assert_close):
    triton_be, torch_be = get_backend("triton"), get_backend("torch")
    assert triton_be.name == "triton" and triton_be.requires_power_of_two_block_size
    block_size, kv_heads, heads, head_dim, num_blocks = 16, 2, 6, 64, 12
    gen = torch.Generator().manual_seed(0)
    tables = torch.randperm(num_blocks, generator=gen)[:8].view(2, 4).to(torch.int32)
    caches = {
        name: [torch.zeros(num_blocks, block_size, kv_heads, head_dim, device=device) for _ in range(2)]
        for name in ("triton", "torch")
    }
    steps = [([20, 9], [20, 9]), ([1, 1], [21, 10])]  # prefill of two prompts, then one decode step
    for q_lens, ctx_lens in steps:
        slots = [
            s for i in range(2) for s in slots_of(tables, i, range(ctx_lens[i] - q_lens[i], ctx_lens[i]), block_size)
        ]
        if q_lens[0] > 1:
            slots[3] = -1  # a padding token: must not be written by either backend
        meta = meta_for(q_lens, ctx_lens, tables, slots, device)
        n = sum(q_lens)
        q, k, v = (torch.randn(n, h, head_dim, generator=gen).to(device) for h in (heads, kv_heads, kv_heads))
        outs = {
            name: be.attention(q, k, v, *caches[name], meta, head_dim**-0.5)
            for name, be in (("triton", triton_be), ("torch", torch_be))
        }
        assert_close(outs["triton"].cpu(), outs["torch"].cpu())
        assert torch.equal(caches["triton"][0], caches["torch"][0])
        assert torch.equal(caches["triton"][1], caches["torch"][1])


def test_backend_layer_ops(device, assert_close):
    be, ref = get_backend("triton"), get_backend("torch")
    x, r, w = (torch.randn(*s).to(device) for s in ((4, 64), (4, 64), (64,)))
    assert_close(be.rms_norm(x, w, 1e-5).cpu(), ref.rms_norm(x, w, 1e-5).cpu())
    for a, b in zip(be.rms_norm(x, w, 1e-5, r), ref.rms_norm(x, w, 1e-5, r)):
        assert_close(a.cpu(), b.cpu())
    assert_close(be.silu_and_mul(x).cpu(), ref.silu_and_mul(x).cpu())
    pos = torch.tensor([0, 3, 5, 1]).to(device)
    q, k, cache = torch.randn(4, 4, 32).to(device), torch.randn(4, 2, 32).to(device), torch.randn(8, 32).to(device)
    for a, b in zip(be.rotary(pos, q, k, cache), ref.rotary(pos, q, k, cache)):
        assert_close(a.cpu(), b.cpu())
