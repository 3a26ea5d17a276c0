"""The systems of benchmarks/throughput.py, one per process: this engine, transformers static `generate`,
transformers continuous batching, llama.cpp, and the device measurement for the roofline.

    python -m benchmarks.systems SPEC.json OUT.json      # what benchmarks.throughput runs per system

Besides throughput every system reports what it can of latency: `ttft_s` (mean time to first token from
submission) and `tpot_ms` (mean time per output token after the first), from the engine's outputs or
llama.cpp's own timings.
"""

import json
import math
import os
import random
import sys
import time
from pathlib import Path

from benchmarks.roofline import measure_device


def make_workload(num_requests, prompt_range, output_range, token_range, seed=0):
    """nano-vllm's bench.py: randint lengths, randint token ids (same draws for every system)."""
    rng = random.Random(seed)
    prompts = [[rng.randint(*token_range) for _ in range(rng.randint(*prompt_range))] for _ in range(num_requests)]
    outputs = [rng.randint(*output_range) for _ in range(num_requests)]
    return prompts, outputs


def _hf_model(spec):
    """The same model for transformers: real SmolLM2 weights, or the shape config with random weights."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from testbed.models.registry import resolve_model

    resolved = resolve_model(spec["model"])
    dtype = getattr(torch, spec["dtype"])
    if resolved.weights_folder is not None:
        model = AutoModelForCausalLM.from_pretrained(resolved.weights_folder, dtype=dtype)
    else:
        cfg = dict(resolved.hf_config)
        cfg.pop("name", None)
        config = LlamaConfig(**cfg)
        with torch.device(spec["device"]):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to(spec["device"]).eval()
    model.generation_config.eos_token_id = None  # EOS ignored, as in the engine runs
    model.generation_config.pad_token_id = 0
    return model


def run_engine(spec, prompts, outputs) -> dict:
    import torch

    from testbed import Engine, EngineConfig, SamplingParams

    kernel = spec["system"].split("-", 1)[1]
    t0 = time.perf_counter()
    engine = Engine(
        EngineConfig(
            model=spec["model"],
            kernel=kernel,
            dtype=spec["dtype"],
            device=spec["device"],
            max_num_seqs=spec["max_num_seqs"],
            max_num_batched_tokens=spec["max_num_batched_tokens"],
            max_model_len=spec["max_model_len"],
            block_size=16,
            enable_prefix_caching=spec.get("prefix_caching", True),
            kv_cache_memory_gb=spec.get("kv_cache_memory_gb", 2.0),
            enforce_eager=spec.get("enforce_eager", False),
            kv_cache_dtype=spec.get("kv_cache_dtype") or "auto",
        )
    )
    setup_s = time.perf_counter() - t0
    kernel_build_s = getattr(engine.backend, "build_seconds", 0.0)  # kernel=cpu: one-off C++ build, 0 if cached
    graphs = getattr(engine.executor, "cuda_graphs", None)
    # warm-up: compiles kernels, fills allocator caches
    warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"warm{i}", prompts[i % len(prompts)][:64], warm)
    while engine.has_unfinished():
        engine.step()
    if spec["device"] == "cuda":
        torch.cuda.synchronize()
    replays_before = graphs.replays if graphs else 0
    start = time.perf_counter()
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        engine.add_request(str(i), p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
    produced, first_token, finish, steps = {}, {}, {}, 0
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()  # on CUDA the step ends by reading the sampled tokens back: synchronised
        for out in outs:
            first_token.setdefault(out.request_id, now)
            if out.finished:
                produced[out.request_id] = len(out.outputs[0].token_ids)
                finish[out.request_id] = now
        steps += 1
    if spec["device"] == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert [produced[str(i)] for i in range(len(prompts))] == outputs, "every request must produce its length"
    return {
        "elapsed_s": elapsed,
        "output_tokens": sum(outputs),
        **latency(start, first_token, finish, outputs),
        "steps": steps,
        "setup_s": setup_s,
        "kernel_build_s": kernel_build_s,
        "num_blocks": engine.kv.num_blocks,
        "preemptions": engine.scheduler.num_preemptions,
        "cuda_graph_replays": (graphs.replays - replays_before) if graphs else 0,
        "cuda_graph_capture_s": graphs.capture_seconds if graphs else 0.0,
        "note": f"max_num_seqs={spec['max_num_seqs']}, max_num_batched_tokens={spec['max_num_batched_tokens']}"
        + ("" if spec.get("prefix_caching", True) else ", no prefix caching")
        + (", CUDA graphs" if graphs and graphs.use_graphs else ", eager")
        + f", KV cache {str(engine.kv_dtype).removeprefix('torch.')}",
    }


def latency(start: float, first_token: dict, finish: dict, outputs: list[int]) -> dict:
    """Mean TTFT (s, from submission at `start`) and TPOT (ms, after the first token) over the requests
    with ids "0".."n-1" (first_token / finish: id -> time)."""
    ids = [str(i) for i in range(len(outputs))]
    ttft = [first_token[i] - start for i in ids]
    tpot = [(finish[i] - first_token[i]) / (n - 1) for i, n in zip(ids, outputs) if n > 1]
    return {"ttft_s": sum(ttft) / len(ttft), "tpot_ms": 1e3 * sum(tpot) / len(tpot) if tpot else None}


def run_llamacpp(spec, prompts, outputs) -> dict:
    """llama.cpp on the same workload: llama-batched-bench when every request has the same lengths (its
    own random prompts of that length, `fixed_shape`), else llama-server with max_num_seqs slots over HTTP."""
    from benchmarks import llamacpp

    llamacpp.model_weights(spec["model"])  # a shape-only model is skipped before any build
    build = llamacpp.ensure_build(spec.get("llamacpp_version") or llamacpp.DEFAULT_VERSION)
    gguf = llamacpp.ensure_gguf(spec["model"], build, "f32" if spec["dtype"] == "float32" else "bf16")
    threads = spec.get("threads") or os.cpu_count()
    cache_type = llamacpp.CACHE_TYPES[spec["kv_cache_dtype"]] if spec.get("kv_cache_dtype") else None
    kv_note = f", KV cache {cache_type or llamacpp.DEFAULT_CACHE_TYPE}"
    info = {**llamacpp.versions(build), "gguf": gguf.name, "llamacpp_threads": threads, "kv_cache_type": cache_type}
    if spec.get("fixed_shape"):
        row = llamacpp.batched_bench(
            build, gguf, len(prompts[0]), outputs[0], [len(prompts)], threads, cache_type=cache_type
        )[0]
        return {
            "elapsed_s": row["t"],
            "output_tokens": sum(outputs),
            "ttft_s": row["t_pp"],  # every prompt prefilled together before the first decode step
            "tpot_ms": 1e3 * row["t_tg"] / outputs[0],
            "llamacpp_row": row,
            **info,
            "note": f"llama-batched-bench -npl {len(prompts)} -t {threads}, flash_attn={row.get('flash_attn')}"
            + kv_note,
        }
    server_args = (build, gguf, spec["max_num_seqs"], spec["max_model_len"], threads)
    with llamacpp.LlamaServer(*server_args, cache_type=cache_type) as server:
        llamacpp.replay_workload(server, [p[:16] for p in prompts[:2]], [4, 4])  # warm-up
        run = llamacpp.replay_workload(server, prompts, outputs)
    rows = run.requests
    failed = rows[rows["error"] != ""]
    if len(failed):
        raise RuntimeError(f"llama-server: {len(failed)} requests failed, first: {failed['error'].iloc[0]}")
    got = rows.set_index("request_id")["output_tokens"].to_dict()
    short = [i for i, n in enumerate(outputs) if got[str(i)] != n]
    first = rows.set_index("request_id")["first_token_time"].to_dict()
    finish = rows.set_index("request_id")["finish_time"].to_dict()
    return {
        "elapsed_s": run.end_time - run.start_time,
        "output_tokens": int(sum(got.values())),
        **latency(run.start_time, first, finish, outputs),
        "short_requests": len(short),
        **info,
        "note": f"llama-server -np {spec['max_num_seqs']} -t {threads}, streamed over HTTP" + kv_note,
    }


def run_hf_static(spec, prompts, outputs) -> dict:
    import torch

    model = _hf_model(spec)
    batch = spec["batch_size"]
    dev = spec["device"]

    def generate(batch_prompts, max_new):
        width = max(len(p) for p in batch_prompts)
        ids = torch.zeros(len(batch_prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(batch_prompts):  # left padding
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        with torch.inference_mode():
            out = model.generate(
                ids.to(dev),
                attention_mask=mask.to(dev),
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        if dev == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == width + max_new, "generate stopped early"

    generate([prompts[0][:16]], 4)  # warm-up
    start = time.perf_counter()
    done_tokens, done_requests, complete = 0, 0, True
    for b in range(0, len(prompts), batch):
        generate(prompts[b : b + batch], max(outputs[b : b + batch]))
        done_tokens += sum(outputs[b : b + batch])
        done_requests += len(outputs[b : b + batch])
        if time.perf_counter() - start > spec["time_limit_s"] and done_requests < len(prompts):
            complete = False  # batches are iid: the rate so far is unbiased
            break
    elapsed = time.perf_counter() - start
    padded = sum(max(outputs[b : b + batch]) * len(outputs[b : b + batch]) for b in range(0, done_requests, batch))
    return {
        "elapsed_s": elapsed,
        "output_tokens": done_tokens,
        "complete": complete,
        "requests_done": done_requests,
        "padded_output_tokens": padded,
        "note": f"batch {batch}, left-padded, {math.ceil(len(prompts) / batch)} batches"
        + ("" if complete else f" (time limit: {done_requests}/{len(prompts)} requests measured)"),
    }


def run_hf_cb(spec, prompts, outputs) -> dict:
    import torch
    from transformers import GenerationConfig

    model = _hf_model(spec)
    gen = GenerationConfig(max_new_tokens=max(outputs), do_sample=False, eos_token_id=-1, pad_token_id=0)
    kwargs = {}
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints

        kwargs["workload_hints"] = WorkloadHints(
            max_prompt_length=max(len(p) for p in prompts), max_generated_length=max(outputs), num_requests=len(prompts)
        )
    except (ImportError, TypeError):
        pass
    manager = model.init_continuous_batching(generation_config=gen, **kwargs)
    t0 = time.perf_counter()
    manager.warmup()
    warmup_s = time.perf_counter() - t0
    attn = str(model.config._attn_implementation)  # as switched by the manager (paged|...)
    manager.start()
    try:
        # warm-up request, then the workload
        manager.add_request(prompts[0][:16], request_id="warm", max_new_tokens=4, eos_token_id=-1)
        while True:
            r = manager.get_result(timeout=600)
            if r is None:
                raise RuntimeError("continuous batching produced no result (warm-up)")
            if r.is_finished():
                break
        if spec["device"] == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for i, (p, o) in enumerate(zip(prompts, outputs)):
            manager.add_request(p, request_id=str(i), max_new_tokens=o, eos_token_id=-1)
        produced = {}
        while len(produced) < len(prompts):
            r = manager.get_result(timeout=spec["time_limit_s"])
            if r is None:
                raise RuntimeError(f"continuous batching stalled after {len(produced)} results")
            if r.error:
                raise RuntimeError(f"request {r.request_id} failed: {r.error}")
            if r.is_finished():
                produced[r.request_id] = len(r.generated_tokens)
        elapsed = time.perf_counter() - start
    finally:
        manager.stop(block=True, timeout=30)
    short = [i for i in range(len(prompts)) if produced[str(i)] != outputs[i]]
    return {
        "elapsed_s": elapsed,
        "output_tokens": sum(produced.values()),
        "warmup_s": warmup_s,
        "short_requests": len(short),
        "attn_implementation": attn,
        "note": f"attn={attn}",
    }


def run_device(spec, prompts, outputs) -> dict:
    import torch

    return measure_device(spec["device"], getattr(torch, spec["dtype"]))


WORKERS = {
    "engine-triton": run_engine,
    "engine-cpu": run_engine,
    "engine-torch": run_engine,
    "hf-static": run_hf_static,
    "hf-cb": run_hf_cb,
    "llamacpp": run_llamacpp,
    "device": run_device,
}


def worker_main(spec_file: str, out_file: str) -> None:
    spec = json.loads(Path(spec_file).read_text())
    if spec.get("threads"):
        import torch

        torch.set_num_threads(spec["threads"])
    prompts, outputs = make_workload(
        spec["num_requests"], spec["prompt_range"], spec["output_range"], spec["token_range"], spec["seed"]
    )
    try:
        result = WORKERS[spec["system"]](spec, prompts, outputs)
    except Exception as e:  # a missing toolchain is a skipped row with its reason, not a crash
        from benchmarks.llamacpp import LlamaCppUnavailable

        if not isinstance(e, LlamaCppUnavailable):
            raise
        result = {"error": f"skipped: {e}"}
    Path(out_file).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    worker_main(*sys.argv[1:3])
