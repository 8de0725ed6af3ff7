#!/usr/bin/env bash
# The GPU check (issue 8), under 8 minutes on one GPU: the tests marked `gpu`, then the cost model of MuLo-SD
# on randomly initialised LlamaGen-XL-shaped models (bf16): one AR step, one 1024-token verification forward,
# and the loop against AR at forced acceptance rates -> docs/gpu_cost.{json,md}.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 240 "$PY" -m pytest -q -m gpu tests/
timeout 300 "$PY" -m mulosd.llamagen.costmodel --device cuda --dtype bfloat16 --out docs/gpu_cost
