"""The default experiment: a small built-in prompt set through the engine, offline, with a summary.

It goes through the trace runner (experiments.run.runner): the same results files, summary and console table
as a trace replay, plus samples.json with the answers.
"""

import json
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console

from experiments.results.atomic import atomic_write_text
from experiments.results.recorder import Recorder
from experiments.run.runner import replay_specs
from experiments.traces import RequestSpec
from testbed import Engine

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
    chats = [
        [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        for i in range(n)
    ]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def run_offline(engine: Engine, workload, out_dir: Path, cfg=None) -> dict:
    """The built-in prompt set, all at t=0, through the trace runner (same results files and summary)."""
    if cfg is not None and (OmegaConf.select(cfg, "replay.repeats", default=1) or 1) > 1:
        raise ValueError("replay.repeats: repeats replay a trace (trace=...); the built-in prompt set runs once")
    if engine.tokenizer is None:
        raise ValueError(
            f"the default workload needs a tokenizer; model {engine.model_name!r} has none "
            f"(use a trace with token ids instead)"
        )
    prompts = build_prompts(engine.tokenizer, workload.num_prompts)
    specs = [
        RequestSpec(
            str(i),
            0.0,
            ids,
            workload.max_tokens,
            ignore_eos=False,
            meta={"line": f"prompt {i}", "question": QUESTIONS[i % len(QUESTIONS)]},
        )
        for i, ids in enumerate(prompts)
    ]
    cfg = cfg if cfg is not None else OmegaConf.create({"experiment": "default", "replay": {"name": "offline"}})
    recorder = Recorder(keep_text=True)
    summary = replay_specs(
        cfg,
        out_dir,
        engine,
        specs,
        temperature=workload.temperature,
        recorder=recorder,
        trace_report={"format": "builtin_prompts", "requests": len(specs)},
    )
    samples = [{"question": s.meta["question"], "answer": recorder.texts.get(s.request_id, "")} for s in specs]
    atomic_write_text(Path(out_dir) / "samples.json", json.dumps(samples, indent=2))
    Console().print(f"first answer: {samples[0]['answer'][:200]!r}")
    return summary
