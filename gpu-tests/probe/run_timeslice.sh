#!/usr/bin/env bash
# Runs gpu-tests/probe/timeslice.cu's cases (issue 9's mechanism): each
# case starts its processes on one shared start time and prints, per
# process, its kernels as a fraction of the solo rate, and the sum.
set -u
cd "$(dirname "$0")"
B=${OUT:-/tmp}/timeslice
nvcc -O2 -o "$B" timeslice.cu || exit 2
SECS=${SECS:-5}
now() { python3 -c 'import time; print(time.monotonic_ns())'; }
declare -A RATE COST
for kind in 1ms:600000000 50us:30000000; do
  name=${kind%%:*}; n=${kind##*:}
  c=$("$B" "$n" 0 0 calibrate | awk '{print $2}')
  k=$(COST_NS=$c "$B" "$n" 0 "$SECS" free | awk '{print $2}')
  COST[$name]=$c; RATE[$name]=$k
  echo "solo $name cost_ns=$c kernels=$k"
done
# case NAME KIND then one arg string per process
case_() {
  local name=$1 kind=$2; shift 2
  local n; [ "$kind" = 1ms ] && n=600000000 || n=30000000
  local start=$(( $(now) + 500000000 )) i=0 pids=() outs=()
  for a in "$@"; do
    outs+=("$B.$i.out")
    COST_NS=${COST[$kind]} "$B" "$n" "$start" "$SECS" $a > "$B.$i.out" &
    pids+=($!); i=$((i+1))
  done
  wait "${pids[@]}"
  python3 - "$name" "$kind" "${RATE[$kind]}" "${outs[@]}" <<'PY'
import sys
name, kind, solo = sys.argv[1], sys.argv[2], int(sys.argv[3])
got = [int(open(f).read().split()[1]) / solo for f in sys.argv[4:]]
print(f"{name:44s} {kind:5s} " + " ".join(f"{g:.3f}" for g in got) + f"  sum {sum(got):.3f}")
PY
}
case_ "free x2" 1ms free free
case_ "burst 0.5ms x2" 1ms "burst 500" "burst 500"
case_ "burst 2ms x2" 1ms "burst 2000" "burst 2000"
case_ "burst 10ms x2" 1ms "burst 10000" "burst 10000"
case_ "window 100ms 50+50 apart" 1ms "window 100 0 50" "window 100 50 50"
case_ "window 100ms 50+50 overlap 5ms" 1ms "window 100 0 50" "window 100 45 50"
case_ "window 100ms 50+50 same phase" 1ms "window 100 0 50" "window 100 0 50"
case_ "window 20ms 10+10 apart" 1ms "window 20 0 10" "window 20 10 10"
case_ "window 100ms 10+20+30+40" 1ms "window 100 0 10" "window 100 10 20" "window 100 30 30" "window 100 60 40"
case_ "free x4" 1ms free free free free
case_ "free x2" 50us free free
case_ "burst 0.5ms x2" 50us "burst 500" "burst 500"
case_ "window 100ms 50+50 apart" 50us "window 100 0 50" "window 100 50 50"
case_ "window 100ms 30+60 apart" 50us "window 100 0 30" "window 100 30 60"
