"""Pool the rounds of several runs of one throughput preset (benchmarks/throughput.py result JSONs) into one
run-by-run comparison: each round against its own device measurement and its own hf-static run, then the
mean and 95% t interval over all rounds (report.paired_rounds, as in a single run's markdown).

    python -m benchmarks.pool_rounds results/throughput/cpu-smollm2-135m-xeon.json \
        results/throughput/cpu-smollm2-135m-xeon-run2.json

The files must hold the same workload (their roofline's bytes and FLOPs are compared); prints markdown."""

import argparse
import json
import sys
from pathlib import Path

from benchmarks.report import paired_rounds


def round_bound(roofline: dict, device: dict) -> dict | None:
    """The bound of the file's workload at one round's measured rates (roofline.workload_bound's max)."""
    if "bandwidth_Bps" not in device or "flops_per_s" not in device:
        return None
    outputs = roofline["bound_output_tok_s"] * roofline["bound_s"]
    seconds = max(roofline["bytes"] / device["bandwidth_Bps"], roofline["flops"] / device["flops_per_s"])
    return {"bound_output_tok_s": outputs / seconds}


def pool(results: list[dict]) -> tuple[dict, list[dict | None]]:
    """(all_runs, bounds) over every file's rounds, renumbered 1.. in file order."""
    workload = {(r["roofline"]["bytes"], r["roofline"]["flops"]) for r in results}
    if len(workload) != 1:
        raise ValueError(f"the files hold different workloads (roofline bytes, FLOPs: {sorted(workload)})")
    all_runs: dict[str, list[dict]] = {}
    bounds: list[dict | None] = []
    for result in results:
        offset = len(bounds)
        bounds += [round_bound(result["roofline"], d) for d in result["device_runs"]]
        for label, runs in result["all_runs"].items():
            all_runs.setdefault(label, []).extend(dict(r, run=r["run"] + offset) for r in runs)
    return all_runs, bounds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="benchmarks/throughput.py result JSONs")
    a = p.parse_args(argv)
    results = [json.loads(f.read_text()) for f in a.files]
    all_runs, bounds = pool(results)
    print(f"Pooled {len(bounds)} rounds of: " + ", ".join(str(f) for f in a.files) + "\n")
    print("\n".join(paired_rounds(all_runs, bounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
