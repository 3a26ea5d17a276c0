"""Speculative decoding study (issue 6): real-text prompt sets and the comparison table.

    python experiments/spec_study.py build                 # write the ShareGPT-style prompt files below
    python run.py -m experiment=spec_decode spec=none,ngram,draft,layerskip                   # code editing
    python run.py -m experiment=spec_decode spec=none,ngram,draft,layerskip \\
        trace.path=results/spec_decode/prompts_chat.json experiment_tag=chat                    # chat
    python experiments/spec_study.py table results/spec_decode/multirun-*   # -> results/spec_decode/README table

Prompt sets (real text, chat-templated for SmolLM2-135M-Instruct, EOS ends an answer):
  code_edit: "add a docstring / add type hints, reply with the complete function" over real functions of the
             Python standard library's own source files (prompt lookup should shine: the answer copies the input);
  chat:      the built-in offline questions (experiments/run/offline.py) with their system preamble.
"""

import ast
import inspect
import json
import sys
import textwrap
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parents[2] / "results" / "spec_decode"
MODULES = [
    "textwrap",
    "shlex",
    "fractions",
    "string",
    "json.decoder",
    "calendar",
    "colorsys",
    "difflib",
    "heapq",
    "statistics",
    "pprint",
    "ipaddress",
]
INSTRUCTIONS = [
    "Add a concise docstring to the following Python function. Reply with the complete updated function only.",
    "Add type hints to the parameters and the return value of the following Python function. Reply with the "
    "complete updated function only.",
]


def stdlib_functions(n: int, min_lines: int = 8, max_lines: int = 30) -> list[tuple[str, str, str]]:
    """(module, function name, source): the first mid-sized function without a docstring of each of MODULES."""
    import importlib

    out = []
    for name in MODULES:
        src = inspect.getsource(importlib.import_module(name))
        nodes = sorted(
            (node for node in ast.walk(ast.parse(src)) if isinstance(node, ast.FunctionDef)),
            key=lambda node: node.lineno,
        )
        for node in nodes:
            segment = ast.get_source_segment(src, node, padded=True)
            if segment is None:  # parsed from src: every node has its position
                raise RuntimeError(f"{name}.{node.name}: no source segment")
            seg = textwrap.dedent(segment)
            if (
                min_lines <= seg.count("\n") + 1 <= max_lines
                and not node.name.startswith("__")
                and ast.get_docstring(node) is None
            ):
                out.append((name, node.name, seg))
                break  # one per module: variety
    return out[:n]


def _templated(tokenizer, messages) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def build(out_dir: Path = OUT) -> None:
    from transformers import AutoTokenizer

    from experiments.run.offline import PREAMBLE, QUESTIONS
    from testbed.models.smollm2 import ensure_smollm2_folder

    tok = AutoTokenizer.from_pretrained(ensure_smollm2_folder())
    out_dir.mkdir(parents=True, exist_ok=True)
    code = []
    for i, (module, fn, src) in enumerate(stdlib_functions(8)):
        text = f"{INSTRUCTIONS[i % 2]}\n\n```python\n{src}\n```"
        code.append(
            {
                "id": f"{module}.{fn}",
                "conversations": [
                    {"from": "human", "value": _templated(tok, [{"role": "user", "content": text}])},
                    {"from": "gpt", "value": src},
                ],
            }
        )  # reference length only; output_len caps the reply
    chat = [
        {
            "id": f"q{i}",
            "conversations": [
                {
                    "from": "human",
                    "value": _templated(tok, [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": q}]),
                },
                {"from": "gpt", "value": ""},
            ],
        }
        for i, q in enumerate(QUESTIONS[:8])
    ]
    for name, data in (("prompts_code_edit.json", code), ("prompts_chat.json", chat)):
        (out_dir / name).write_text(json.dumps(data, indent=1))
        print(f"wrote {out_dir / name} ({len(data)} conversations)")


COLUMNS = [
    "spec_method",
    "total_output_tokens",
    "duration",
    "output_throughput",
    "num_steps",
    "spec_drafted",
    "spec_accepted",
    "spec_acceptance_rate",
    "spec_mean_accepted_length",
    "spec_propose_time_s",
]


def table(run_dirs: list[Path]) -> str:
    """One markdown table per sweep folder: per proposer vs spec=none of the same folder (same trace)."""
    parts = []
    for d in run_dirs:
        rows = []
        for summary_file in sorted(Path(d).glob("*/summary.json")):
            s = json.loads(summary_file.read_text())
            s.setdefault("spec_method", "none")
            # P(draft j accepted | draft j verified); older summaries name it spec_per_position_acceptance
            per_position = s.get("spec_per_position_conditional_acceptance", s.get("spec_per_position_acceptance"))
            s["per_position"] = " ".join("-" if x is None else f"{x:.2f}" for x in per_position or [])
            cfg = summary_file.parent / "config.yaml"
            s["spec_cfg"] = ""
            if cfg.exists():
                import yaml

                spec = (yaml.safe_load(cfg.read_text()) or {}).get("spec", {})
                s["spec_cfg"] = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "method" and v is not None)
            rows.append(s)
        if not rows:
            continue
        df = pd.DataFrame(rows)
        base = df[df.spec_method == "none"]
        if base.empty:
            raise SystemExit(f"{d}: no spec=none run to compare against")
        b = base.iloc[0]
        lines = [
            f"**{Path(d).name}** (trace: {rows[0].get('trace')}, {int(b.num_requests)} requests)",
            "",
            "| spec | settings | output tokens | duration (s) | output tok/s | speedup vs none | target steps | "
            "step reduction | acceptance rate | mean accepted length | per-position acceptance | drafting time (s) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        for _, r in df.iterrows():
            spec = r.spec_method != "none"
            lines.append(
                f"| {r.spec_method} | {r.spec_cfg if spec else ''} | {int(r.total_output_tokens)} | {r.duration:.1f} | "
                f"{r.output_throughput:.1f} | {b.duration / r.duration:.2f}x | {int(r.num_steps)} | "
                f"{b.num_steps / r.num_steps:.2f}x | "
                + (
                    f"{r.spec_acceptance_rate:.1%} | {r.spec_mean_accepted_length:.2f} | {r.per_position} | "
                    f"{r.spec_propose_time_s:.1f} |"
                    if spec
                    else "- | 1.00 | - | - |"
                )
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("build", "table"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "build":
        build()
    else:
        print(table([Path(p) for p in sys.argv[2:]]))
