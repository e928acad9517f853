#!/usr/bin/env bash
cd "$(dirname "$0")"
cc -O2 -I/usr/local/cuda/include -o /tmp/pacing pacing.c -lpthread -L/usr/local/cuda/lib64/stubs -lcuda -lnvidia-ml && /tmp/pacing 2>&1 | tee ${OUT:-/tmp}/pacing.log
