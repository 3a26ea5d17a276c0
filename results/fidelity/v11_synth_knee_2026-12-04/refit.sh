# the curve-form refit of this calibration (no new measurement) and both v11 studies priced by it
set -x
cd /work/main
V=results/fidelity/v11_synth_knee_2026-12-04
python -m experiments.calibration.refit $V/profile/cpu-amd-epyc-smollm2-135m-cpu-float32.json \
    --out $V/profile_refit/cpu-amd-epyc-smollm2-135m-cpu-float32.json
for f in v11_synth_knee_2026-12-04 v11_synth_knee_high_2026-12-04; do
  OMP_NUM_THREADS=1 python -m experiments.studies.fidelity_reanalyze results/fidelity/$f \
      --profile $V/profile_refit/cpu-amd-epyc-smollm2-135m-cpu-float32.json --reprice --out results/fidelity/$f/refit_curve
done
