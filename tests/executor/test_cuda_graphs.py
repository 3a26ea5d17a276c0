"""The GPU execution path: CUDA-graph decode (padding to captured sizes), pinned input staging, no syncs.

CPU-checkable parts run everywhere: capture sizes and padding, the persistent block tables against the
allocator's block lists through preemption / prefix hits / speculative trims, and the graph path run eagerly
(static buffers, padded rows) against plain eager. GPU tests are marked `gpu` and skip without CUDA.
"""

import random
import warnings

import numpy as np
import pytest
import torch

from testbed import LLM, SamplingParams
from testbed.executor import model_runner as model_runner_module
from testbed.executor.cuda_graphs import default_capture_sizes, padded_batch_size

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # Triton needs CUDA tensors unless it runs in the interpreter
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def random_prompts(n, lo, hi, vocab=4096, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def greedy(llm, prompts, max_tokens=12):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


# ---- capture sizes and padding ---------------------------------------------------------------------
def test_default_capture_sizes():
    assert default_capture_sizes(1) == [1]
    assert default_capture_sizes(6) == [1, 2, 4, 6]
    assert default_capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert default_capture_sizes(100)[-2:] == [96, 100]
    assert default_capture_sizes(4096)[-1] == 512


def test_padded_batch_size():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_batch_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16)] == [1, 2, 4, 8, 8, 16, 16]
    assert padded_batch_size(17, sizes) is None


# ---- block tables kept from the SchedulerOutputs == the allocator's lists ------------------------------
def _check_against_allocator(monkeypatch, engine):
    """Wrap stage_inputs: every step's block tables and slots must be what the allocator's block lists
    give (the executor only ever sees the changes pushed in SchedulerOutputs)."""
    original = model_runner_module.stage_inputs
    steps = []
    block_size = engine.config.cache.block_size

    def checked(out, tables, buffers, pad_to=None):
        staged = original(out, tables, buffers, pad_to)
        fast = staged.to_device()
        positions = fast.positions.cpu().tolist()
        starts = fast.meta.query_start_loc.cpu().tolist()
        for i, (request, n) in enumerate(zip(out.requests, fast.meta.seq_lens.tolist())):
            ids = engine.kv.get_block_ids(request.request_id)
            used = -(-n // block_size)  # only the blocks a kernel may read
            assert fast.meta.block_tables[i, :used].cpu().tolist() == ids[:used]
            for row in range(starts[i], starts[i + 1]):
                pos = positions[row]
                assert fast.meta.slot_mapping[row] == ids[pos // block_size] * block_size + pos % block_size
        steps.append(1)
        return staged

    monkeypatch.setattr(model_runner_module, "stage_inputs", checked)
    return steps


@pytest.mark.parametrize("mode", ["preemption", "prefix_cache", "spec_trim"])
def test_block_tables_match_naive(monkeypatch, mode):
    prompts = random_prompts(10, 3, 40)
    if mode == "prefix_cache":
        prompts = [prompts[0][:30] + p for p in prompts]
    kw = dict(model="tiny", block_size=4, max_num_seqs=6, max_num_batched_tokens=32)
    if mode == "preemption":
        kw["num_blocks"] = 40
    elif mode == "prefix_cache":
        kw["num_blocks"] = 400
    else:
        kw.update(
            num_blocks=400,
            block_size=2,
            speculative_config=dict(method="ngram", num_speculative_tokens=5, prompt_lookup_min=1),
        )
        prompts = [(p[:6] * 6)[:30] for p in prompts]  # repetitive: ngram drafts, some rejected
    llm = LLM(**kw)
    steps = _check_against_allocator(monkeypatch, llm.engine)
    greedy(llm, prompts, max_tokens=24)
    assert len(steps) > 10
    if mode == "preemption":
        assert llm.engine.scheduler.num_preemptions > 0
    if mode == "prefix_cache":
        assert llm.engine.kv.prefix_hits > 0
    tables = llm.engine.executor.tables
    assert len(tables.row_of) <= llm.engine.config.scheduler.max_num_seqs  # finished requests are forgotten


def test_host_executor_runs_requests_to_completion():
    llm = LLM(model="tiny", executor="host", num_blocks=200, max_num_seqs=4)
    outs = llm.generate(random_prompts(6, 5, 30), SamplingParams(max_tokens=7, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 7 for o in outs)
    assert llm.engine.executor.last_inputs is not None


# ---- the graph path run eagerly (static buffers, padded rows) == plain eager ---------------------------
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter, empty rows
@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_padded_graph_path_matches_eager(kernel):
    # the interpreter is slow: fewer, shorter requests for triton; 3 and 5 requests pad to 4 and 8
    num, max_tokens = (7, 12) if kernel == "torch" else (5, 5)
    prompts = random_prompts(num, 4, 30, seed=1)
    kw = dict(
        model="tiny",
        kernel=kernel,
        block_size=8,
        num_blocks=200,
        max_num_seqs=num,
        max_model_len=128,
        dtype="float32",
        device=DEVICE,
        enforce_eager=True,
    )
    eager = greedy(LLM(**kw), prompts, max_tokens)
    llm = LLM(**kw, cuda_graph_sizes=[1, 2, 4, 8], cuda_graph_dry_run=True)
    graphs = llm.engine.executor.cuda_graphs
    assert graphs is not None and not graphs.use_graphs
    padded = greedy(llm, prompts, max_tokens)
    assert graphs.replays >= max_tokens - 1, "decode steps should have taken the padded path"
    assert padded == eager


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter, empty rows
def test_decode_kernel_with_loose_bound_and_forced_splits(paged_kv_small):
    """What a graph launch does: max_seq_len is a loose bound (max_model_len), splits fixed by batch size."""
    from testbed_kernels.reference import paged_attention_ref
    from testbed_kernels.triton_paged_decode import paged_decode

    k_cache, v_cache, tables, seq_lens = paged_kv_small([0, 1, 17, 70, 130], 16, 2, 32)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(5, 4, 32, generator=gen)
    qsl = torch.arange(6, dtype=torch.int32)
    ref = paged_attention_ref(q, k_cache, v_cache, qsl, seq_lens, tables, 32**-0.5)
    args = [t.to(DEVICE) for t in (q, k_cache, v_cache, seq_lens, tables)]
    for splits in (1, 3, 8):
        out = paged_decode(*args, 32**-0.5, max_seq_len=4096, num_splits=splits).cpu()
        assert torch.allclose(out[1:], ref[1:], atol=1e-5), splits
        assert torch.count_nonzero(out[0]) == 0  # an empty (padding) row is zeros, not NaN


@pytest.fixture
def paged_kv_small():
    def make(ctx_lens, block_size, kv_heads, head_dim):
        gen = torch.Generator().manual_seed(0)
        per_seq = max(-(-n // block_size) for n in ctx_lens) + 1
        num_blocks = len(ctx_lens) * per_seq
        k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
        tables = torch.randperm(num_blocks, generator=gen).view(len(ctx_lens), per_seq).to(torch.int32)
        return k, torch.randn(k.shape, generator=gen), tables, torch.tensor(ctx_lens, dtype=torch.int32)

    return make


# ---- GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_match_eager(dtype):
    # long enough prompts that small batches use split-KV inside the graphs
    prompts = random_prompts(13, 300, 700, seed=2)
    kw = dict(
        model="tiny",
        kernel="triton",
        block_size=16,
        max_num_seqs=16,
        max_model_len=1024,
        dtype=dtype,
        num_blocks=2048,
        max_num_batched_tokens=2048,
    )
    eager_llm = LLM(**kw, enforce_eager=True)
    assert eager_llm.engine.executor.cuda_graphs is None
    eager = greedy(eager_llm, prompts, max_tokens=16)
    llm = LLM(**kw)
    graphs = llm.engine.executor.cuda_graphs
    assert graphs is not None and graphs.graphs, "kernel=triton on CUDA should capture decode graphs"
    out = greedy(llm, prompts, max_tokens=16)
    assert graphs.replays > 10
    if dtype == "float32":
        assert out == eager
    else:  # bf16: padding changes matmul shapes (rounding), so only the first graph-decoded token must agree
        same = sum(a[:2] == b[:2] for a, b in zip(out, eager))
        assert same >= 0.8 * len(prompts), (out, eager)


@pytest.mark.gpu
@needs_cuda
def test_decode_steps_sync_only_to_read_tokens():
    """Per decode step, the only host-device synchronisation is reading the sampled tokens."""
    llm = LLM(model="tiny", kernel="triton", max_num_seqs=8, max_model_len=512, num_blocks=1024)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, p in enumerate(random_prompts(8, 20, 60, seed=3)):
        engine.add_request(str(i), p, params)
    for _ in range(3):  # prefill and first decode steps (warm caches)
        engine.step()
    steps = 20
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert engine.executor.cuda_graphs.replays >= steps
    assert len(syncs) <= steps, [str(w.message)[:200] for w in syncs[:5]]


@pytest.mark.gpu
@needs_cuda
def test_pinned_staging_on_cuda():
    llm = LLM(model="tiny", kernel="triton", max_num_seqs=4, num_blocks=256, max_model_len=256)
    buffers = llm.engine.executor.input_buffers
    assert buffers.cuda and all(t.is_pinned() for t, _ in buffers._host[0].values())
    assert greedy(llm, random_prompts(3, 5, 20), max_tokens=4)
    assert np.all(buffers._host[0]["slot_mapping"][1] >= -1)


@pytest.mark.gpu
@needs_cuda
def test_async_scheduling_with_graphs_matches_synchronous():
    """Async scheduling is the CUDA default: the async-scheduling engine (graphs on, placeholders filled from the
    previous step) gives the synchronous engine's greedy tokens."""
    prompts = random_prompts(24, 20, 300, seed=4)
    kw = dict(model="tiny", kernel="triton", max_num_seqs=16, max_model_len=1024, num_blocks=2048, dtype="float32")
    sync = greedy(LLM(**kw, async_scheduling=False), prompts, max_tokens=20)
    llm = LLM(**kw)
    assert llm.engine.async_steps is not None, "async scheduling should be on by default on CUDA"
    assert greedy(llm, prompts, max_tokens=20) == sync
