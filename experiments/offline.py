"""The default experiment: a small built-in prompt set through the engine, offline, with a summary.

The trace runner (experiments.runner) is the full version; this is the smallest real run.
"""
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed import Engine, SamplingParams

# Real questions of varied length; the shared preamble gives the prefix cache something to find.
PREAMBLE = "You are a helpful assistant. Keep answers short and concrete."
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a hash table is in two sentences.",
    "Give three tips for staying focused while studying.",
    "What causes the seasons on Earth?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "How do I convert Celsius to Fahrenheit?",
    "Name the planets of the solar system in order from the Sun.",
    "What is the difference between a list and a tuple in Python?",
    "Why is the sky blue?",
    "Suggest a name for a small bakery by the sea.",
    "What is photosynthesis?",
    "Write a haiku about autumn rain.",
    "How does a bicycle stay upright when moving?",
    "What are prime numbers? Give five examples.",
    "Describe the water cycle briefly.",
]


def build_prompts(tokenizer, n: int) -> list[list[int]]:
    chats = [[{"role": "system", "content": PREAMBLE}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
             for i in range(n)]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def run_offline(engine: Engine, workload, out_dir: Path) -> dict:
    if engine.tokenizer is None:
        raise ValueError(f"the default workload needs a tokenizer; model {engine.model_name!r} has none "
                         f"(use a trace with token ids instead)")
    prompts = build_prompts(engine.tokenizer, workload.num_prompts)
    params = SamplingParams(temperature=workload.temperature, max_tokens=workload.max_tokens, seed=0)
    start = engine.clock()
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, params, arrival_time=start)
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    duration = engine.clock() - start
    outs = [finished[str(i)] for i in range(len(prompts))]
    ttfts = sorted(o.metrics.first_token_time - o.metrics.arrival_time for o in outs)
    n_in = sum(len(p) for p in prompts)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    summary = {
        "completed": len(outs),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "duration": duration,
        "output_throughput": n_out / duration,
        "total_token_throughput": (n_in + n_out) / duration,
        "mean_ttft_ms": 1e3 * sum(ttfts) / len(ttfts),
        "median_ttft_ms": 1e3 * ttfts[len(ttfts) // 2],
        "prefix_hit_rate": engine.kv.prefix_hit_rate,
        "num_preemptions": engine.scheduler.num_preemptions,
        "num_steps": engine.step_count,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "samples.json").write_text(json.dumps(
        [{"question": QUESTIONS[i % len(QUESTIONS)], "answer": o.outputs[0].text} for i, o in enumerate(outs)],
        indent=2))
    print_summary(summary, engine, outs[0].outputs[0].text, out_dir)
    return summary


def print_summary(summary: dict, engine: Engine, sample: str, out_dir: Path) -> None:
    table = Table(title=f"{engine.model_name} | kernel={engine.config.kernel} | scheduler={engine.config.scheduler}"
                        f" | block_size={engine.config.block_size} | device={engine.device}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("requests", f"{summary['completed']}"), ("input tokens", f"{summary['total_input_tokens']}"),
            ("output tokens", f"{summary['total_output_tokens']}"), ("duration", f"{summary['duration']:.2f} s"),
            ("output tok/s", f"{summary['output_throughput']:.1f}"),
            ("total tok/s", f"{summary['total_token_throughput']:.1f}"),
            ("mean TTFT", f"{summary['mean_ttft_ms']:.0f} ms"), ("median TTFT", f"{summary['median_ttft_ms']:.0f} ms"),
            ("prefix-hit rate", f"{summary['prefix_hit_rate']:.1%}"), ("preemptions", f"{summary['num_preemptions']}")]
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(f"first answer: {sample[:200]!r}")
    console.print(f"results: {out_dir}")
