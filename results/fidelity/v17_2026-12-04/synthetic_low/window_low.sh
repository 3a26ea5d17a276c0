set -x
# $1 = calibration folder (its profile/), $2 = output folder: the synthetic cells below the knee (closed 1/4/16,
# open 50/80% of the capacity its closed c64 measures) on that calibration's profile
cd /work/main && date && uptime && git log --oneline -1
P=$(ls results/fidelity/$1/profile/*.json) && V=results/fidelity/$2 && mkdir -p $V
OMP_NUM_THREADS=1 timeout 1800 python -m experiments.studies.fidelity --profile $P --traces synthetic \
    --concurrency 1 4 16 64 --loads 0.5 0.8 --scale 1 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V --profile $P 2>&1 | tail -5
date
