"""Swap preemption moves the exact KV bytes out to the host pool and back into fresh device blocks."""

import torch

from testbed import Engine, EngineConfig, SamplingParams
from testbed.core.allocators.base import CopyKind

from .helpers import sharpen, workload


def test_swap_restores_the_same_kv_bytes():
    engine = Engine(
        EngineConfig.from_kwargs(
            model="tiny",
            max_model_len=256,
            block_size=4,
            num_blocks=40,
            max_num_batched_tokens=32,
            max_num_seqs=6,
            preemption_mode="swap",
            num_cpu_blocks=64,
        )
    )
    sharpen(engine)
    swap, runner = engine.scheduler.swap, engine.executor
    saved, checked = {}, []

    def blocks(ids):
        idx = torch.tensor(ids, dtype=torch.long)
        return [t[idx].clone() for layer in runner.kv_caches for t in layer]

    run_copies = runner.copier.run

    def run_checked(copies):
        for src, dst, kind in copies:
            if kind is CopyKind.TO_HOST:  # device blocks src about to go out: remember them
                saved[tuple(dst)] = (list(src), blocks(src))
                run_copies([(src, dst, kind)])
            else:  # back in: the new device blocks hold the same bytes
                run_copies([(src, dst, kind)])
                old_ids, before = saved.pop(tuple(src))
                after = blocks(dst)
                checked.append(old_ids != list(dst))
                assert all(torch.equal(a, b) for a, b in zip(before, after))

    runner.copier.run = run_checked

    prompts, max_tokens = workload(10)
    for i, (p, m) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert checked and not saved and swap.num_swap_outs == swap.num_swap_ins == len(checked)
    assert swap.num_free == 64
    assert any(checked)  # at least once the KV came back into other device blocks
