set -x
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/v10_synth_knee_2026-12-03 && mkdir -p $V
P=results/fidelity/v10_knee_2026-12-03/profile/cpu-amd-epyc-smollm2-135m-cpu-float32.json
OMP_NUM_THREADS=1 timeout 2100 python -m experiments.studies.fidelity --profile $P --traces synthetic \
    --concurrency 64 --loads 0.4 0.6 0.8 --scale 1 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V --profile $P 2>&1 | tail -5
date
