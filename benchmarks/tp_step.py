"""Tensor parallelism against one rank, measured: mean step time of the same greedy batch under TP=1 and
TP=N, alternated round by round in one process (A B, B A, ...), ratio per round, mean and 95% t interval.
The share of greedy tokens equal between the two is reported every round.

    python -m benchmarks.tp_step --tp 3 --model smollm2-135m --rounds 6             # CPU, gloo
    python -m benchmarks.tp_step --tp 2 --model llama-3.2-1b --device cuda          # 2 GPUs, NCCL

On a CPU the ranks share the cores and talk over loopback gloo, so TP is expected to be slower: this measures
what it costs (the point of TP on a CPU is correctness and the GPU path). With fewer GPUs than --tp on CUDA
it prints one line saying so and exits 0.
"""

import argparse
from pathlib import Path

from benchmarks.common import environment, load_average, markdown_table, publish
from experiments.statistics.intervals import ci95


def run_round(llm, prompts, params) -> tuple[float, list]:
    """(mean engine step duration in ms, tokens) of one generate call."""
    steps = []
    llm.engine.step_callbacks[:] = [lambda s: steps.append(s.duration_s)]
    outs = llm.generate(prompts, params)
    return 1e3 * sum(steps) / len(steps), [o.outputs[0].token_ids for o in outs]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=3)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--kernel", default="auto", help="auto under TP: torch on a CPU, triton on CUDA")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", type=Path, default=Path("results/tp"))
    args = p.parse_args(argv)

    import torch

    from testbed.llm import LLM
    from testbed.sampling_params import SamplingParams

    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        print(f"tp_step: skipped: TP={args.tp} needs {args.tp} GPUs, this machine has {torch.cuda.device_count()}")
        return
    env = environment()
    env["load_before"] = load_average()
    kernel = "torch" if args.kernel == "auto" and args.device == "cpu" else args.kernel
    common = dict(model=args.model, kernel=kernel, device=args.device, num_blocks=1024, max_num_seqs=args.batch)
    engines = {n: LLM(tensor_parallel_size=n, **common) for n in (1, args.tp)}
    prompts = [{"prompt_token_ids": [1] + [100 + 7 * i + j for j in range(args.prompt_len - 1)]}
               for i in range(args.batch)]  # fmt: skip
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    for llm in engines.values():  # warm up: one whole unmeasured round each (first steps pay page faults)
        run_round(llm, prompts, params)
    rows, ratios = [], []
    for r in range(args.rounds):
        order = (1, args.tp) if r % 2 == 0 else (args.tp, 1)
        step_ms, tokens = {}, {}
        for n in order:
            step_ms[n], tokens[n] = run_round(engines[n], prompts, params)
        pairs = [(a, b) for x, y in zip(tokens[1], tokens[args.tp]) for a, b in zip(x, y)]
        same = sum(a == b for a, b in pairs) / len(pairs)
        ratios.append(step_ms[args.tp] / step_ms[1])
        rows.append([r, "-".join(map(str, order)), step_ms[1], step_ms[args.tp], ratios[-1], f"{same:.1%}"])
        print(f"round {r}: TP=1 {step_ms[1]:.1f} ms/step, TP={args.tp} {step_ms[args.tp]:.1f} ms/step", flush=True)
    engines[args.tp].engine.close()
    env["load_after"] = load_average()
    mean, half = ci95(ratios)
    md = (
        f"# TP={args.tp} vs TP=1 step time ({args.model}, {args.device}, kernel {kernel})\n\n"
        f"{args.batch} requests of {args.prompt_len} prompt tokens, {args.max_tokens} greedy tokens each; "
        f"mean engine step time per round, rounds alternated. 'same tokens': greedy tokens equal to TP=1's, "
        f"position by position (float32 on a CPU: expected 100%; bf16 on GPUs: partial sums reduced in another "
        f"order may flip near-ties).\n\n"
        + markdown_table(["round", "order", "TP=1 ms/step", f"TP={args.tp} ms/step", "ratio", "same tokens"], rows)
        + f"\n\nTP={args.tp} / TP=1 step time: {mean:.2f}x (95% t interval +- {half:.2f}, {args.rounds} rounds)\n"
        f"- machine: {env['cpu']} ({env['cpu_count']} cores), {env['device']}, torch threads {env['torch_threads']}\n"
    )
    data = {"args": vars(args) | {"out": str(args.out)}, "rounds": rows, "ratio_mean": mean, "ratio_ci95": half}
    publish(args.out, f"tp_step_{args.device}_tp{args.tp}", md, env, data)


if __name__ == "__main__":
    main()
