set -x
# $1 = results folder name: a calibration an hour after v17's (21:15), the every-row linear grid, then v14/v15's Azure cells (closed 1/4/16/64,
# open 30/50/70/90/120%) and synthetic knee cells (c64, open 100-140%) on its profile
cd /work/main && date && uptime && git log --oneline -1
V=results/fidelity/$1 && mkdir -p $V/profile
for try in 1 2; do
  OMP_NUM_THREADS=1 timeout 400 python -m experiments.calibration.calibrate model=smollm2-135m kernel=cpu --out $V/profile 2>&1 | tee $V/calibration.log
  ls $V/profile/*.json >/dev/null 2>&1 && break
  mkdir -p results/fidelity/refused/$1_try$try && cp $V/calibration.log results/fidelity/refused/$1_try$try/
  date; uptime
done
P=$(ls $V/profile/*.json) && date && uptime
for T in azure synthetic; do
  if [ $T = azure ]; then ARGS="--concurrency 1 4 16 64 --loads 0.3 0.5 0.7 0.9 1.2 --scale 2"
  else ARGS="--concurrency 64 --loads 1.0 1.1 1.2 1.3 1.4 --scale 1"; fi
  OMP_NUM_THREADS=1 timeout 2400 python -m experiments.studies.fidelity --profile $P --traces $T $ARGS \
      --repeats 3 --drift-matched --out $V/$T 2>&1 | tee $V/study_$T.log
  date; uptime
  OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze $V/$T --profile $P 2>&1 | tail -5
done
date
