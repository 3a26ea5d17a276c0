set -x
# $1 = results folder name: the synthetic knee cells (v12's) on v14's profile (refined linear grid, f6c89b8)
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/$1
P=$(ls results/fidelity/v14_azure_2026-12-04/profile/*.json)
OMP_NUM_THREADS=1 timeout 2400 python -m experiments.studies.fidelity --profile $P --traces synthetic \
    --concurrency 64 --loads 1.0 1.1 1.2 1.3 1.4 --scale 1 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V --profile $P 2>&1 | tail -5
date
