# Simulator speed on this VM, nothing else of this project running: sim_speed of three commits from
# `git archive` copies, the order rotated each round (5 rounds): base = 454d240 (main at the start of
# the session), new = the commit measured, old = 475c9a0 (the commit whose run gave the 57.9 s);
# then cluster_speed of new, 3 runs.
set -x
NEW=${NEW:-HEAD}
date; uptime
rm -rf /tmp/ssn && mkdir -p /tmp/ssn/old /tmp/ssn/base /tmp/ssn/new
git -C /work/main archive 475c9a0 | tar -x -C /tmp/ssn/old
git -C /work/main archive 454d240 | tar -x -C /tmp/ssn/base
git -C /work/main archive $NEW | tar -x -C /tmp/ssn/new
for r in 1 2 3 4 5; do
  case $((r % 3)) in 1) order="base new old";; 2) order="new old base";; 0) order="old base new";; esac
  for side in $order; do
    cd /tmp/ssn/$side && PYTHONPATH=/tmp/ssn/$side python -m benchmarks.sim_speed --trace-path /work/shared/traces/azure_llm_2023_conv.csv --profile-requests 200 --out /tmp/ssn/out_${side}_$r > /tmp/ssn/log_${side}_$r 2>&1
    python -c "import json,sys; d=json.load(open('/tmp/ssn/out_${side}_$r/sim_speed.json')); print('$side', $r, d.get('wall_s'), d.get('process_cpu_s'), d['environment']['load_average'])"
  done
done
date; uptime
for r in 1 2 3; do
  cd /tmp/ssn/new && PYTHONPATH=/tmp/ssn/new python -m benchmarks.cluster_speed --trace-path /work/shared/traces/azure_llm_2023_conv.csv --out /tmp/ssn/cluster_$r > /tmp/ssn/log_cluster_$r 2>&1
  tail -3 /tmp/ssn/log_cluster_$r
done
date; uptime
