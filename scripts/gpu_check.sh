#!/usr/bin/env bash
# The GPU check, under 10 minutes on one GPU: the tests marked `gpu`, then the cost model of MuLo-SD on
# randomly initialised models of the released backbones' shapes (bf16): LlamaGen-XL (512 px over 256 px) and
# Tar's AR-DTok-LP (512 px, and 1024 px over 256 px): weights and KV cache per image, one AR step, one
# whole-image verification forward, and the loop against AR at forced acceptance rates
# -> $DEST/gpu_cost{,_tar512,_tar1024}.{json,md} (DEST: docs/ by default).
#
#   scripts/gpu_check.sh              # tests, then the three cost models
#   scripts/gpu_check.sh tests        # the tests alone
#   scripts/gpu_check.sh cost         # the cost models alone
# On the device machine: carry [".whl"] (scripts/zoo_gpu.sh wheels), DEST=$OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_python.sh
DEST=${DEST:-docs}
PART=${1:-all}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
status=0
if [ "$PART" != cost ]; then
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py || status=$?
fi
if [ "$PART" != tests ]; then
    timeout 180 "$PY" -m mulosd.reports.costmodel --device cuda --dtype bfloat16 --out "$DEST/gpu_cost" || status=$?
    timeout 150 "$PY" -m mulosd.reports.costmodel --size tar512 --rates 0.97 --device cuda \
        --out "$DEST/gpu_cost_tar512" || status=$?
    timeout 60 "$PY" -m mulosd.reports.costmodel --size tar1024 --rates '' --device cuda \
        --out "$DEST/gpu_cost_tar1024" || status=$?
fi
exit $status
