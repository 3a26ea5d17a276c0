"""Paged decode attention with the KV cache on 2 MiB pages (host_memory.zeros_on_huge_pages, what
allocate_kv_cache does on a CPU) against 4 KiB pages (torch.zeros), in one process, alternating.

An engine-sized cache: --layers (30) layers of K and V, --blocks (2,900) blocks of 16 tokens each (SmolLM2:
3 KV heads x 64, fp32: 2.1 GB per side), 32 sequences of 40-640 tokens whose block tables are drawn at random
from the pool (--tables shuffled) or laid out in order (contiguous, as a fresh engine hands them out). One
pass = one decode step's attention over every layer; best of --repeats passes per alternation. Results:
results/kernels/kv_pages.{json,md}.

    python -m benchmarks.kv_pages
"""

import argparse
import sys
from pathlib import Path

from benchmarks.common import environment, load_average, markdown_table, publish
from benchmarks.cpu_kernels import best_seconds

RESULTS = Path(__file__).resolve().parents[1] / "results" / "kernels"
HEADS, KV_HEADS, HEAD_DIM, BLOCK, SEQS = 9, 3, 64, 16, 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--blocks", type=int, default=2900)
    p.add_argument("--rounds", type=int, default=4, help="alternations of the two page sizes per table layout")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    per_seq = 640 // BLOCK + 1
    if SEQS * per_seq > a.blocks:
        raise SystemExit(f"--blocks must be at least {SEQS * per_seq}")

    import torch

    import testbed_kernels.cpu as cpu_kernels
    from testbed.executor.host_memory import zeros_on_huge_pages

    cpu_kernels.load()
    torch.set_num_threads(a.threads)
    env = {**environment(), "load_before": load_average()}
    gen = torch.Generator().manual_seed(0)
    shape = (a.blocks, BLOCK, KV_HEADS, HEAD_DIM)
    allocate = {"2 MiB": lambda: zeros_on_huge_pages(shape, torch.float32), "4 KiB": lambda: torch.zeros(shape)}
    caches = {pages: [(make(), make()) for _ in range(a.layers)] for pages, make in allocate.items()}
    for layers in caches.values():
        for k, v in layers:
            k.normal_(generator=gen), v.normal_(generator=gen)
    lens = torch.randint(40, 640, (SEQS,), generator=gen, dtype=torch.int32)
    tables = {
        "shuffled": torch.randperm(a.blocks, generator=gen)[: SEQS * per_seq].view(SEQS, per_seq).int(),
        "contiguous": torch.arange(SEQS * per_seq).view(SEQS, per_seq).int(),
    }
    q = torch.randn(SEQS, HEADS, HEAD_DIM, generator=gen)
    out = torch.empty_like(q)
    kv_bytes = a.layers * int(lens.sum()) * 2 * KV_HEADS * HEAD_DIM * 4
    runs, rows = [], []
    for layout, table in tables.items():
        best = {}
        for r in range(a.rounds):
            for pages in list(caches) if r % 2 == 0 else list(caches)[::-1]:

                def step(layers=caches[pages], table=table):
                    for k, v in layers:
                        torch.ops.testbed_cpu.paged_decode(out, q, k, v, table, lens, HEAD_DIM**-0.5)

                seconds = best_seconds(step, 1, a.repeats)
                runs.append({"tables": layout, "pages": pages, "round": r + 1, "ms": seconds * 1e3})
                best[pages] = min(best.get(pages, float("inf")), seconds)
        by_round: dict[int, dict[str, float]] = {}
        for x in runs:
            if x["tables"] == layout:
                by_round.setdefault(x["round"], {})[x["pages"]] = x["ms"]
        ratios = [ms["4 KiB"] / ms["2 MiB"] for ms in by_round.values()]  # each round's speed-up
        rows.append([layout, *(round(best[p] * 1e3, 2) for p in caches), round(kv_bytes / best["2 MiB"] / 1e9, 1),
                     round(kv_bytes / best["4 KiB"] / 1e9, 1), f"{best['4 KiB'] / best['2 MiB']:.2f}x",
                     f"{min(ratios):.2f}-{max(ratios):.2f}x"])  # fmt: skip
        print(f"[kv_pages] {layout}: {rows[-1]}", file=sys.stderr, flush=True)
    env["load_after"] = load_average()
    md = (
        "# Paged decode with the KV cache on 2 MiB vs 4 KiB pages (same process, alternating)\n\n"
        f"{a.layers} layers x {a.blocks} blocks of {BLOCK} tokens (fp32, {KV_HEADS} KV heads x {HEAD_DIM}, "
        f"{HEADS} query heads), {SEQS} sequences of 40-640 tokens ({kv_bytes / 1e6:.0f} MB of K/V read per "
        f"pass), {a.threads} threads; best of {a.repeats} passes in each of {a.rounds} alternations.\n\n"
        + markdown_table(
            ["block tables", "2 MiB ms", "4 KiB ms", "2 MiB GB/s", "4 KiB GB/s", "speed-up (best)", "per round"],
            rows,
        )
        + f"\n\n- cpu: {env['cpu']} ({env['cpu_count']} cores); date {env['date']}; git {env['git']}; "
        f"AnonHugePages while measured: {_anon_huge_pages()}\n"
    )
    a.out.mkdir(parents=True, exist_ok=True)
    publish(a.out, "kv_pages", md, env, {"config": vars(a) | {"out": str(a.out)}, "runs": runs})
    return 0


def _anon_huge_pages() -> str:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("AnonHuge"))
    except (OSError, StopIteration):
        return "n/a"


if __name__ == "__main__":
    sys.exit(main())
