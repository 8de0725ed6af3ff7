#!/usr/bin/env bash
# A whole device lease in one call (the device tool's 10-minute command): the `gpu` tests first (about 10 s; a
# broken CUDA path stops here, not after minutes of data preparation), then the zoo at scale
# (scripts/zoo_gpu.sh, MAX_TIME of training), then the cost models with what is left of the deadline. What comes
# back is at most 8 files in $OUT: the export (config.json, model.safetensors), train.log, report.txt (the AR
# report, the tests' log appended), metrics.csv and the cost models' JSON (their tables are rebuilt from it).
#
#   device run: scripts/gpu_lease.sh   with carry [".whl"] (scripts/zoo_gpu.sh wheels, here, once) and timeout_s 600
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_python.sh
export OUT=${OUT:?run through the device tool, which sets OUT}
DEADLINE=${DEADLINE:-570}  # seconds from the start, inside the tool's 600
SECONDS=0
scripts/gpu_check.sh tests > /tmp/gpu_tests.log 2>&1
status=$?
cat /tmp/gpu_tests.log
if [ $status -ne 0 ]; then
    cp /tmp/gpu_tests.log "$OUT/gpu_tests.log"
    echo "gpu tests failed: the lease stops here (log in \$OUT/gpu_tests.log)"
    exit $status
fi
MAX_TIME=${MAX_TIME:-00:00:03:30} scripts/zoo_gpu.sh
cat /tmp/gpu_tests.log >> "$OUT/report.txt"
echo "== zoo done at ${SECONDS} s; cost models with $((DEADLINE - SECONDS)) s left"
DEST=/tmp/cost timeout $((DEADLINE - SECONDS)) scripts/gpu_check.sh cost
cp /tmp/cost/*.json "$OUT/" 2>/dev/null
ls -la "$OUT"
