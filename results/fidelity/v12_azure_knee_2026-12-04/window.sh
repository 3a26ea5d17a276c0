set -x
# $1 = results folder name, $2 = profile json
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/$1 && mkdir -p $V && P=$2
OMP_NUM_THREADS=1 timeout 1800 python -m experiments.studies.fidelity --profile $P --traces azure \
    --concurrency 64 --loads 0.3 0.5 0.7 0.9 --scale 2 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V --profile $P 2>&1 | tail -5
date
