#!/bin/bash
# Alternates the smoke job on the base commit (2f9d602) and on this branch; records wall time and load.
export AUGSBERT_DATA_DIR=/work/shared/data HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
V=/work/wt/labelstart/.venv/bin
one() {  # name codedir
  local name=$1 dir=$2
  rm -rf /tmp/ls-$name
  echo "$name start $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/ls-bench/log
  local t0=$(date +%s.%N)
  if [ "$dir" = base ]; then
    (cd /tmp/ls-basecode && PYTHONPATH=/tmp/ls-basecode $V/augsbert run jobs/smoke.yaml run_dir=/tmp/ls-$name > /tmp/ls-bench/$name.out 2>&1)
  else
    (cd /work/wt/labelstart && $V/augsbert run jobs/smoke.yaml run_dir=/tmp/ls-$name > /tmp/ls-bench/$name.out 2>&1)
  fi
  local rc=$?
  local t1=$(date +%s.%N)
  echo "$name end $(date -u +%T) rc=$rc wall=$(echo "$t1 - $t0" | bc) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/ls-bench/log
  grep -E "^\| (silver|cross_encoder|candidates) " /tmp/ls-$name/summary.md >> /tmp/ls-bench/log 2>/dev/null
}
one before1 base; one after1 branch; one before2 base; one after2 branch
echo done >> /tmp/ls-bench/log
