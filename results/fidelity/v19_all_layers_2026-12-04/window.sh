set -x
# the calibration with the linear layers timed across all layers in turn (1bf5942; v18_2026-12-04/all_layers,
# 23:32-23:38), then v17/v18's synthetic knee cells (c64, open 100-140%) on its profile
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/v19_all_layers_2026-12-04 && P=$(ls $V/profile/*.json)
OMP_NUM_THREADS=1 timeout 1000 python -m experiments.studies.fidelity --profile $P --traces synthetic \
    --concurrency 64 --loads 1.0 1.1 1.2 1.3 1.4 --scale 1 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V --profile $P 2>&1 | tail -5
date
