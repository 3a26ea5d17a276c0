"""The sampler's cost per step for a batch of requests, by feature, against an earlier sampler.

    python -m benchmarks.sampler                                # batch 256, SmolLM2's vocabulary (49,152)
    python -m benchmarks.sampler --batch 64 --rounds 30 --baseline-ref 63668c1 --out /tmp/sampler

One row per configuration: every request greedy, plain temperature, temperature with top-k/top-p/min-p,
+ top-5 logprobs, penalties on every request, and a JSON-schema grammar on 1 in 8 requests (needs the
smollm2 tokenizer). Rounds of all configurations are interleaved (current and baseline sampler in turn),
so machine load hits both alike; medians are reported. `--baseline-ref` loads testbed/executor/sampler.py
as it was at a git commit (its `sample(logits, request_ids, params)` signature) for the rows it supports.
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment, load_average, markdown_table, write_json
from experiments.results.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "sampler"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}


def configs():
    from testbed import SamplingParams
    from testbed.structured import StructuredOutputsParams

    json_params = SamplingParams(temperature=1.0, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    return {
        "greedy": (lambda i: SamplingParams(temperature=0), True),
        "temperature": (lambda i: SamplingParams(temperature=0.8), True),
        "top-k/top-p/min-p": (lambda i: SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05), True),
        "+ logprobs=5": (lambda i: SamplingParams(temperature=0.8, top_p=0.9, logprobs=5), False),
        "penalties (all rows)": (
            lambda i: SamplingParams(
                temperature=0.8, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1
            ),
            False,
        ),
        "json schema (1 in 8 rows)": (lambda i: json_params if i % 8 == 0 else SamplingParams(temperature=0.8), False),
    }


def load_baseline(ref: str):
    source = subprocess.run(
        ["git", "show", f"{ref}:testbed/executor/sampler.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_sampler.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_sampler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sampler


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--baseline-ref", default=None, help="git commit of the sampler to compare against")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from testbed.executor.sampler import Sampler
    from testbed.models.smollm2 import ensure_smollm2_folder
    from testbed.request import Request

    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2_folder())
    vocab, n = len(tokenizer), args.batch
    load_before = load_average()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n, vocab, generator=gen) * 4
    Baseline = load_baseline(args.baseline_ref) if args.baseline_ref else None
    cases = {}
    for name, (make, baseline_ok) in configs().items():
        params = [make(i) for i in range(n)]
        requests = []
        for i, p in enumerate(params):
            r = Request(f"{name}-{i}", [1, 2, 3, 4], p, arrival_time=0.0, eos_token_ids=[tokenizer.eos_token_id])
            requests.append(r)
        sampler = Sampler(0, "cpu", tokenizer, vocab, [tokenizer.eos_token_id])
        base = Baseline(0) if Baseline is not None and baseline_ok else None
        cases[name] = (sampler, requests, params, base)
    times = {name: ([], []) for name in cases}
    for _ in range(args.rounds + 2):  # the first two rounds warm up (grammar compilation, allocations)
        for name, (sampler, requests, params, base) in cases.items():
            start = time.perf_counter()
            tokens, _ = sampler.sample(logits, requests)
            times[name][0].append(time.perf_counter() - start)
            for r, t in zip(requests, tokens):  # grow outputs so penalties and grammars see history
                if r.sampling_params.structured_outputs is None or len(r.output_token_ids) < 12:
                    r.append_output_token(t, None, 0.0)
            if base is not None:
                ids = [r.request_id for r in requests]
                start = time.perf_counter()
                base.sample(logits, ids, params)
                times[name][1].append(time.perf_counter() - start)
    rows = []
    for name, (ours, theirs) in times.items():
        ours, theirs = ours[2:], theirs[2:]
        row = [name, statistics.median(ours) * 1e3, min(ours) * 1e3]
        row += (
            [statistics.median(theirs) * 1e3, statistics.median(ours) / statistics.median(theirs)]
            if theirs
            else ["", ""]
        )
        rows.append(row)
    env = environment()
    headers = ["configuration", "median (ms)", "min (ms)", f"baseline {args.baseline_ref} median (ms)", "ratio"]
    table = markdown_table(headers, rows)
    command = " ".join(["python -m benchmarks.sampler", *sys.argv[1:]])
    text = (
        f"# Sampler cost per step: batch {n}, vocabulary {vocab}\n\n{table}\n\n"
        f"- machine: {env['cpu']}, {env['cpu_count']} cores; torch {env['torch']} ({env['torch_threads']} threads)\n"
        f"- date: {env['date']}; git {env['git']}\n- command: `{command}`\n"
        f"- load average (1/5/15 min) before: {load_before}; after: {load_average()} (shared machine: noisy)\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "sampler.md", text)
    write_json(args.out / "sampler.json", {"env": env, "batch": n, "vocab": vocab, "times_s": times})
    print(text)


if __name__ == "__main__":
    main()
