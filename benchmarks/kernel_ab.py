"""Same-run A/B of this tree's kernel=cpu attention kernels against another git revision's build.

    python -m benchmarks.kernel_ab --baseline HEAD~1      # -> results/kernels/kernel_ab.{md,json}

The baseline's sources are checked out (`git worktree`) into a temporary folder and built there by its own
testbed_kernels.cpu.load, as any checkout is (the first run compiles, ~1 min). Each round starts one process per side,
the order reversed every other round, so drift in a shared machine's speed hits both alike; each process times
the cases on identical inputs (fixed seeds) and hashes its outputs, so the table also says whether the two
builds agree bit for bit. Cases, SmolLM2-135M's attention shapes, fp32:
  decode   one decode step's attention over --layers (30) layers of distinct caches (memory-bound, as in
           the engine): 32 sequences, contexts uniform in [40, 640), block size 16, shuffled blocks; beside
           it, in the same process, torch's sum over as many bytes (the machine's streaming read rate).
  prefill  one step's causal prefill attention over as many layers: prompts of 300, 450 and 274 tokens, whole.
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import environment, load_average, markdown_table, publish
from benchmarks.cpu_kernels import best_seconds

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "kernels"
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
PROMPTS = [300, 450, 274]


def paged_caches(lens: list[int], layers: int, gen):
    import torch

    per_seq = max(lens) // BLOCK + 1
    blocks = len(lens) * per_seq
    caches = [
        (
            torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen),
            torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen),
        )
        for _ in range(layers)
    ]
    tables = torch.randperm(blocks, generator=gen).view(len(lens), per_seq).int()
    return caches, tables


def child(tree: Path, repeats: int, layers: int) -> dict:
    """Times the cases with the kernels of `tree` (its testbed_kernels.cpu, built or loaded from its cache)."""
    sys.path.insert(0, str(tree))
    import importlib

    import torch

    # trees before the package's rename (a top-level `kernels` shadowed Hugging Face's package of that name)
    package = "testbed_kernels" if (tree / "testbed_kernels").is_dir() else "kernels"
    cpu_kernels = importlib.import_module(f"{package}.cpu")

    assert Path(cpu_kernels.__file__).resolve().is_relative_to(tree.resolve()), cpu_kernels.__file__
    cpu_kernels.load()
    ops = torch.ops.testbed_cpu
    gen = torch.Generator().manual_seed(0)
    result = {}

    lens = torch.randint(40, 640, (32,), generator=gen, dtype=torch.int32)
    caches, tables = paged_caches(lens.tolist(), layers, gen)
    q = torch.randn(len(lens), HEADS, HEAD_DIM, generator=gen)
    outs = [torch.empty_like(q) for _ in caches]

    def decode():
        for (k, v), out in zip(caches, outs):
            ops.paged_decode(out, q, k, v, tables, lens, HEAD_DIM**-0.5)

    kv_bytes = layers * int(lens.sum()) * 2 * KV_HEADS * HEAD_DIM * 4
    t_sum = best_seconds(torch.randn(kv_bytes // 4, generator=gen).sum, 1, repeats)
    t_decode = best_seconds(decode, 1, repeats)
    result["decode"] = {
        "ms": t_decode * 1e3,
        "GBps": kv_bytes / t_decode / 1e9,
        "sum_GBps": kv_bytes / t_sum / 1e9,
        "sha1": hashlib.sha1(b"".join(o.numpy().tobytes() for o in outs)).hexdigest()[:12],
    }

    caches, tables = paged_caches(PROMPTS, layers, gen)
    q = torch.randn(sum(PROMPTS), HEADS, HEAD_DIM, generator=gen)
    starts = [sum(PROMPTS[:i]) for i in range(len(PROMPTS))]
    chunks = torch.tensor([[i, lo, n, n] for i, (lo, n) in enumerate(zip(starts, PROMPTS))])
    outs = [torch.empty_like(q) for _ in caches]

    def prefill():
        for (k, v), out in zip(caches, outs):
            ops.paged_prefill(out, q, k, v, tables, chunks, HEAD_DIM**-0.5)

    t_prefill = best_seconds(prefill, 1, repeats)
    flops = layers * 4 * HEADS * HEAD_DIM * sum(n * (n + 1) // 2 for n in PROMPTS)  # causal pairs only
    result["prefill"] = {
        "ms": t_prefill * 1e3,
        "GFLOPs": flops / t_prefill / 1e9,
        "sha1": hashlib.sha1(b"".join(o.numpy().tobytes() for o in outs)).hexdigest()[:12],
    }
    return result


def run_side(tree: Path, threads: int, repeats: int, layers: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.kernel_ab", "--child", str(tree), "--threads", str(threads)]
    proc = subprocess.run(
        cmd + ["--repeats", str(repeats), "--layers", str(layers)], cwd=ROOT, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kernel_ab: the run on {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default="HEAD", help="git revision to compare this tree against")
    p.add_argument("--rounds", type=int, default=4, help="processes per side")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per case per process (best kept)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=30, help="layers of distinct caches per pass")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        import torch

        torch.set_num_threads(a.threads)
        print(json.dumps(child(a.child, a.repeats, a.layers)))
        return 0

    sha = subprocess.run(["git", "rev-parse", "--short", a.baseline], cwd=ROOT, capture_output=True, text=True)
    if sha.returncode != 0:
        raise SystemExit(f"kernel_ab: no git revision {a.baseline!r}: {sha.stderr.strip()}")
    baseline = sha.stdout.strip()
    env = {**environment(), "load_before": load_average(), "threads": a.threads, "baseline": baseline}
    runs = {"baseline": [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="kernel_ab_") as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), baseline], cwd=ROOT, check=True, capture_output=True
        )
        try:
            sides = {"baseline": tree, "this tree": ROOT}
            for r in range(a.rounds):
                for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                    runs[name].append(run_side(sides[name], a.threads, a.repeats, a.layers))
                    print(f"[kernel_ab] round {r + 1}/{a.rounds} {name}: {runs[name][-1]}", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    env["load_after"] = load_average()

    def best(name, case, key, pick=max):
        return pick(run[case][key] for run in runs[name])

    def same(case):
        return len({run[case]["sha1"] for side in runs.values() for run in side}) == 1

    d_new, d_old = best("this tree", "decode", "ms", min), best("baseline", "decode", "ms", min)
    p_new, p_old = best("this tree", "prefill", "ms", min), best("baseline", "prefill", "ms", min)
    rows = [
        ["decode attention", f"{d_old:.1f}", f"{d_new:.1f}", f"{d_old / d_new:.2f}x"]
        + [
            f"{best('baseline', 'decode', 'GBps'):.1f} / {best('this tree', 'decode', 'GBps'):.1f} GB/s "
            f"(torch sum {best('this tree', 'decode', 'sum_GBps'):.1f})",
            "yes" if same("decode") else "no",
        ],
        ["prefill attention", f"{p_old:.1f}", f"{p_new:.1f}", f"{p_old / p_new:.2f}x"]
        + [
            f"{best('baseline', 'prefill', 'GFLOPs'):.0f} / {best('this tree', 'prefill', 'GFLOPs'):.0f} GFLOP/s",
            "yes" if same("prefill") else "no",
        ],
    ]
    per_run = [
        [case, name, " / ".join(f"{run[case]['ms']:.1f}" for run in runs[name])]
        for case in ("decode", "prefill")
        for name in runs
    ]
    md = (
        f"# kernel=cpu attention kernels: this tree vs {baseline} (same run)\n\n"
        f"{env['cpu']} ({env['cpu_count']} cores), {a.threads} threads, SmolLM2-135M shapes, fp32, {a.layers} layers "
        f"of distinct caches per pass; best of {a.repeats} passes per process, {a.rounds} processes per side, "
        "interleaved. Decode: 32 sequences, contexts uniform in [40, 640); prefill: prompts "
        f"{', '.join(map(str, PROMPTS))} whole (GFLOP/s count the causal pairs only).\n\n"
        + markdown_table(
            ["case", f"{baseline} ms", "this tree ms", "speed-up", "rate (baseline / this)", "bit-identical"], rows
        )
        + "\n\nEvery process's best pass (ms):\n\n"
        + markdown_table(["case", "side", "runs"], per_run)
        + f"\n\n- date {env['date']}; git {env['git']}; torch {env['torch']}\n"
    )
    publish(a.out, "kernel_ab", md, env, {"config": vars(a) | {"out": str(a.out)}, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
