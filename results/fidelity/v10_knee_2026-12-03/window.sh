set -x
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/v10_knee_2026-12-03 && mkdir -p $V/profile
for try in 1 2 3; do
  OMP_NUM_THREADS=1 timeout 660 python -m experiments.calibration.calibrate model=smollm2-135m kernel=cpu --out $V/profile 2>&1 | tee $V/calibration.log
  ls $V/profile/*.json >/dev/null 2>&1 && break
  mkdir -p results/fidelity/refused/v10_try$try && cp $V/calibration.log results/fidelity/refused/v10_try$try/
  date; uptime
done
P=$(ls $V/profile/*.json) && date && uptime
OMP_NUM_THREADS=1 timeout 1800 python -m experiments.studies.fidelity --profile $P --traces azure \
    --concurrency 64 --loads 0.3 0.5 0.7 --scale 2 --repeats 3 --drift-matched --out $V 2>&1 | tee $V/study.log
date; uptime
OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V 2>&1 | tail -5
date
