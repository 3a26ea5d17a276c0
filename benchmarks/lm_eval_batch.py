"""lm-evaluation-harness `local-completions` against this server with batch_size 4 vs 1: the same
log-likelihoods? (A batch is one /v1/completions call with a list of token-id prompts.)

lm-eval is not a dependency of this project: install it in its own environment and pass its command,
    python -m venv --system-site-packages /work/venv-lmeval && /work/venv-lmeval/bin/pip install "lm-eval[api]"
    python -m benchmarks.lm_eval_batch --lm-eval /work/venv-lmeval/bin/lm_eval
The tasks are a small multiple-choice set written here (no download): every choice of every doc is one
log-likelihood request, and each doc's question is also answered greedily (8 tokens). Writes
results/lm_eval_batch/summary.json: per batch size the accuracy, each log-likelihood and generation, the
largest log-likelihood difference between the two runs and whether the generations are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

DOCS = [
    ("The capital of France is", [" Paris", " Berlin", " Madrid"], 0),
    ("Two plus two equals", [" four", " five", " seven"], 0),
    ("The sun rises in the", [" east", " west", " north"], 0),
    ("Water freezes at zero degrees", [" Celsius", " Kelvin", " Newton"], 0),
    ("The opposite of hot is", [" cold", " warm", " loud"], 0),
    ("A week has seven", [" days", " hours", " years"], 0),
    ("The largest planet in our solar system is", [" Jupiter", " Mars", " Venus"], 0),
    ("Cats are often kept as", [" pets", " tools", " clouds"], 0),
]
TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""
GEN_TASK = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{choices[0]}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""


def write_task(folder: Path) -> None:
    data = folder / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in DOCS))
    (folder / "tiny_mc.yaml").write_text(TASK.format(data=data))
    (folder / "tiny_gen.yaml").write_text(GEN_TASK.format(data=data))


def run_lm_eval(lm_eval: str, url: str, tokenizer: str, folder: Path, batch_size: int) -> tuple[list, list]:
    """(log-likelihoods per doc and choice, greedy generation per doc)."""
    out = folder / f"out_bs{batch_size}"
    args = f"model=smollm2-135m,base_url={url}/v1/completions,tokenizer={tokenizer},num_concurrent=1,max_retries=1"
    cmd = [lm_eval, "--model", "local-completions", "--model_args", args, "--tasks", "tiny_mc,tiny_gen",
           "--include_path", str(folder), "--batch_size", str(batch_size), "--output_path", str(out),
           "--log_samples"]  # fmt: skip
    subprocess.run(cmd, check=True, env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})

    def rows(task):
        (samples,) = out.rglob(f"samples_{task}_*.jsonl")
        return sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])

    lls = [[float(resp[0][0]) for resp in r["resps"]] for r in rows("tiny_mc")]
    return lls, [r["resps"][0][0] for r in rows("tiny_gen")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm-eval", required=True, help="the lm_eval command of an environment with lm-eval")
    ap.add_argument("--out", default="results/lm_eval_batch/summary.json")
    a = ap.parse_args()
    import torch

    from testbed import Engine
    from testbed.config import EngineConfig
    from testbed.models.smollm2 import ensure_smollm2_folder
    from testbed.server import ServerThread

    torch.set_num_threads(1)
    engine = Engine(EngineConfig(model="smollm2-135m", num_blocks=200, max_model_len=1024, max_num_seqs=8))
    with tempfile.TemporaryDirectory() as tmp, ServerThread(engine) as srv:
        folder = Path(tmp)
        write_task(folder)
        runs = {bs: run_lm_eval(a.lm_eval, srv.url, str(ensure_smollm2_folder()), folder, bs) for bs in (1, 4)}
    lls, gens = {bs: r[0] for bs, r in runs.items()}, {bs: r[1] for bs, r in runs.items()}
    diffs = [abs(x - y) for r1, r4 in zip(lls[1], lls[4]) for x, y in zip(r1, r4)]
    acc = {bs: sum(max(range(len(r)), key=r.__getitem__) == d[2] for r, d in zip(v, DOCS)) / len(DOCS)
           for bs, v in lls.items()}  # fmt: skip
    summary = {
        "requests": len(diffs),
        "max_abs_diff": max(diffs),
        "acc": acc,
        "generations_equal": gens[1] == gens[4],
        "loglikelihoods": lls,
        "generations": gens,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("requests", "max_abs_diff", "acc", "generations_equal")}))


if __name__ == "__main__":
    main()
