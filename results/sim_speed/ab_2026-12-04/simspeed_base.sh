# the issue's baseline commit (475c9a0: 57.9 s on 2026-12-01's VM) vs main on this VM, 3 rounds alternated
set -x
date; uptime
rm -rf /tmp/sb && mkdir -p /tmp/sb/base /tmp/sb/new
git -C /work/main archive 475c9a0 | tar -x -C /tmp/sb/base
git -C /work/main archive HEAD | tar -x -C /tmp/sb/new
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for side in $order; do
    cd /tmp/sb/$side && PYTHONPATH=/tmp/sb/$side python -m benchmarks.sim_speed --trace-path /work/shared/traces/azure_llm_2023_conv.csv --profile-requests 200 --out /tmp/sb/out_${side}_$r > /tmp/sb/log_${side}_$r 2>&1
    python -c "import json; d=json.load(open('/tmp/sb/out_${side}_$r/sim_speed.json')); print('$side', $r, d.get('wall_s'), d.get('simulated_s'), d.get('steps'))"
  done
done
date; uptime
