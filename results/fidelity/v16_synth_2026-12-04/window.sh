set -x
# $1 = results folder name: a calibration with every row to 64 on the linear grid (e4b0f87), then v14/v15's
# synthetic knee cells (c64, open 100-140%) on its profile
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/$1 && mkdir -p $V/profile
for try in 1 2; do
  OMP_NUM_THREADS=1 timeout 400 python -m experiments.calibration.calibrate model=smollm2-135m kernel=cpu --out $V/profile 2>&1 | tee $V/calibration.log
  ls $V/profile/*.json >/dev/null 2>&1 && break
  mkdir -p results/fidelity/refused/$1_try$try && cp $V/calibration.log results/fidelity/refused/$1_try$try/
  date; uptime
done
P=$(ls $V/profile/*.json) && date && uptime
OMP_NUM_THREADS=1 timeout 1500 python -m experiments.studies.fidelity --profile $P --traces synthetic \
    --concurrency 64 --loads 1.0 1.1 1.2 1.3 1.4 --scale 1 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V --profile $P 2>&1 | tail -5
date
