#!/usr/bin/env bash
# One-shot GPU check (an H200 session): everything issue 3 needs a GPU for, in one command.
#
#   1. GPU tests: CUDA-graph decode == eager, one sync per decode step, pinned staging, Triton vs torch timing
#   2. throughput benchmark, llama-3.2-1b shape (bf16, random weights), 256 requests: engine (triton, torch),
#      transformers static generate, transformers continuous batching, roofline bound
#   3. Triton kernel check (experiments/gpu_kernel_check.py): correctness + timings at realistic shapes
#   4. host-side cost per step (host executor, executor=host) on that machine's CPU
#   5. GPU idle time between steps, synchronous vs async scheduling (torch profiler)
#   6. simulator fidelity on the GPU: a calibration (step profile + operator microbenchmarks, its self-check
#      recorded; --force so a noisy one still yields figures, marked so) and a reduced fidelity study
#      (synthetic trace, closed loop c=1/16/64, open loop at 50/100/120% of capacity, 3 real repeats)
#   7. with 2+ GPUs: tensor parallelism over NCCL, TP=2 vs TP=1 tokens and step time (skipped with one GPU)
# Full results go to $OUT (or results/gpu_check/ when $OUT is unset); a short table is printed last.
# Steps run in this order under a shared time budget (BUDGET_S, default 540 s) and are skipped once it is
# spent, so one 10-minute device call is enough:
#
#   run(command="bash experiments/gpu_check.sh", timeout_s=600)
#
# Nothing here needs Hydra. Optional: BENCH_ARGS="--model llama-3.1-8b" for the 8B shape (needs more time).
# STEPS="tests idle throughput tp kernels host fidelity" (default: all) runs a subset. The fidelity step
# comes last and is skipped once the shared budget is spent, so give it its own device call:
#   run(command="STEPS=fidelity BUDGET_S=560 bash experiments/gpu_check.sh", timeout_s=600)
# The fidelity step's setup: FID_MODEL (llama-3.2-1b, shape only), FID_DEVICE (cuda), FID_KERNEL (triton),
# FID_DTYPE (bfloat16), FID_SCALE (0.25), FID_ARGS (extra Hydra overrides for both), FID_STUDY_ARGS (the
# study's cells). On a CPU, for the code path only (tests/sim/test_gpu_check_fidelity.py):
#   STEPS=fidelity FID_DEVICE=cpu FID_MODEL=tiny FID_KERNEL=torch FID_DTYPE=float32 FID_SCALE=0.07 \
#   FID_ARGS="cache.num_blocks=128" FID_STUDY_ARGS="--repeats 2 --concurrency 4 --loads 0.5 1.2" \
#   OMP_NUM_THREADS=1 bash experiments/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
BUDGET_S=${BUDGET_S:-540}
START=$(date +%s)
LOG="$OUT/log.txt"
: > "$LOG"
STATUS=()

STEPS=${STEPS:-all}
want() { [[ $STEPS == all || " $STEPS " == *" $1 "* ]]; }

left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

step() {  # step NAME MAX_SECONDS COMMAND...
    local name=$1 max=$2; shift 2
    local remaining; remaining=$(left)
    if (( remaining < 30 )); then
        STATUS+=("$name: skipped (time budget spent)")
        echo "== $name: skipped, ${remaining}s left" | tee -a "$LOG"
        return
    fi
    (( max > remaining )) && max=$remaining
    echo "== $name (limit ${max}s) $(date +%T)" | tee -a "$LOG"
    local t0; t0=$(date +%s)
    timeout --kill-after=10 "$max" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    STATUS+=("$name: rc=$rc in $(( $(date +%s) - t0 ))s")
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee -a "$LOG"

want tests && step "gpu tests" 150 python3 -m pytest -q -o addopts="" -p no:cacheprovider -m "gpu or not slow" \
    tests/executor/test_cuda_graphs.py tests/kernels/test_gpu_timing.py tests/engine/test_async_scheduling.py \
    --junitxml="$OUT/pytest_gpu.xml"

want idle && step "GPU idle gap (sync vs async scheduling)" 90 python3 -m benchmarks.gpu_idle_gap --out "$OUT"

want throughput && step "throughput llama-3.2-1b" 300 python3 -m benchmarks.throughput --preset gpu --out "$OUT" \
    --name throughput --time-limit 60 --system-timeout 150 ${BENCH_ARGS:-}

NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if ! want tp; then :
elif (( NGPU >= 2 )); then  # tensor parallelism: NCCL, TP=2 tokens and step time against TP=1 (benchmarks/tp_step.py)
    step "tensor parallel tests" 90 python3 -m pytest -q -o addopts="" -p no:cacheprovider -m gpu \
        tests/parallel/test_tp_gpu.py
    step "TP=1 vs TP=2 step time" 150 python3 -m benchmarks.tp_step --tp 2 --model llama-3.2-1b --device cuda \
        --batch 32 --rounds 4 --out "$OUT"
else
    STATUS+=("tensor parallel: skipped (this device has $NGPU GPU; TP=2 needs 2)")
    echo "== tensor parallel: skipped, this device has $NGPU GPU (TP=2 needs 2)" | tee -a "$LOG"
fi

want kernels && step "kernel check" 100 python3 -m benchmarks.gpu_kernel_check "$OUT/kernels.json" --iters 10

want host && step "host cost per step" 30 python3 -m benchmarks.host --running 256 --steps 100 --no-gc-freeze-rows --out "$OUT"

FID_SETUP=(model="${FID_MODEL:-llama-3.2-1b}" kernel="${FID_KERNEL:-triton}" device="${FID_DEVICE:-cuda}"
           dtype="${FID_DTYPE:-bfloat16}" ${FID_ARGS:-})
if want fidelity; then
    rm -rf "$OUT/profiles"
    step "calibration" 180 python3 -m experiments.calibration.calibrate "${FID_SETUP[@]}" --quick --force --out "$OUT/profiles"
    PROFILE=$(ls "$OUT"/profiles/*.json 2>/dev/null | head -1)
    if [[ -n $PROFILE ]]; then
        step "fidelity (reduced)" 300 python3 -m experiments.studies.fidelity "${FID_SETUP[@]}" --profile "$PROFILE" \
            --out "$OUT/fidelity" --scale "${FID_SCALE:-0.25}" --probe-repeats 1 --traces synthetic \
            ${FID_STUDY_ARGS:---repeats 3 --concurrency 1 16 64 --loads 0.5 1.0 1.2}
    else
        STATUS+=("fidelity (reduced): skipped (no profile)")
    fi
fi

echo
echo "================ gpu_check summary ($(( $(date +%s) - START ))s) ================"
for s in "${STATUS[@]}"; do echo "  $s"; done
[[ -f "$OUT/kernels.json" ]] && python3 - "$OUT/kernels.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["results"]
bad = [r for r in rows if not r["ok"]]
dec = [r for r in rows if r["kernel"] == "decode"]
print(f"  kernels: {len(rows) - len(bad)}/{len(rows)} within tolerance; copy bw {d['copy_bw_gbps']:.0f} GB/s; "
      f"best decode {max((r['pct_copy_bw'] for r in dec), default=0):.0f}% of copy bw")
for r in bad:
    print(f"    FAILED {r['kernel']} {r['config']} err {r['err']:.2e}")
EOF
[[ -f "$OUT/host_overhead.md" ]] && grep "^| " "$OUT/host_overhead.md" | cut -d'|' -f1-5
[[ -f "$OUT/throughput.md" ]] && { grep "^| \|^Roofline" "$OUT/throughput.md" | cut -c1-220; }
[[ -f "$OUT/fidelity/summary.md" ]] && grep -A12 "^### executor.cost_model=profile" "$OUT/fidelity/summary.md" | cut -c1-220
exit 0
