# A/B of the simulator's speed on this VM: d1ff401 (measured 2026-12-03 at 11.09 s mean) vs main, 6 rounds alternated
set -x
date; uptime
rm -rf /tmp/ss && mkdir -p /tmp/ss/old /tmp/ss/new
git -C /work/main archive d1ff401 | tar -x -C /tmp/ss/old
git -C /work/main archive HEAD | tar -x -C /tmp/ss/new
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    cd /tmp/ss/$side && PYTHONPATH=/tmp/ss/$side python -m benchmarks.sim_speed --trace-path /work/shared/traces/azure_llm_2023_conv.csv --profile-requests 200 --out /tmp/ss/out_${side}_$r > /tmp/ss/log_${side}_$r 2>&1
    python -c "import json,sys; d=json.load(open('/tmp/ss/out_${side}_$r/sim_speed.json')); print('$side', $r, d.get('wall_s', d))" | cut -c1-300
  done
done
date; uptime
