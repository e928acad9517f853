set -u
bash gpu-tests/run.sh launchcost 2>&1 | tail -8
B=/tmp/vgpu-bin/cuclient-dlsym
for lim in 90; do
 R=/tmp/diag-$lim.cache; rm -f $R
 LIBCUDA_LOG_LEVEL=5 CUDA_DEVICE_SM_LIMIT=$lim CUDA_DEVICE_MEMORY_SHARED_CACHE=$R LD_PRELOAD=$PWD/target/release/libvgpu.so taskset -c 2,3 $B launchab 20000 31 2>$OUT/trace-$lim.txt
 grep -c "timed" $OUT/trace-$lim.txt; grep -o "stream idle before [a-z]*, start event waited [a-z]*" $OUT/trace-$lim.txt | sort | uniq -c
 grep "timed" $OUT/trace-$lim.txt | sed -E 's/.*timed ([0-9]+) ns \(idle stream: (true|false)\): cost ([0-9]+) ns.*/\2 \1 \3/' | awk '{n[$1]++; s[$1]+=$2; c[$1]+=$3} END{for (k in n) print "idle="k, "n="n[k], "mean_elapsed="s[k]/n[k], "mean_cost="c[k]/n[k]}'
 grep "timed" $OUT/trace-$lim.txt | tail -5
 target/release/vgpuctl status --json $R | python3 -c "import json,sys; d=json.load(sys.stdin)['regions'][0]['devices'][0]; print({k: d.get(k) for k in ('throttled_seconds','launches_throttled','bucket_scale','utilization_percent')})"
 gzip -f $OUT/trace-$lim.txt
done
