#!/usr/bin/env bash
# The zoo's AR model trained on one GPU in under 10 minutes. EXPERIMENT picks which:
# - zoo_ar_v3 (the default, the paper's regime): the shipped synthscenes_ar_v3 (INIT) trained on over the
#   64 / 128 / 256 px grids with a GPU's batch (64 scenes of 256 px) and 96 shards of 256 px scenes drawn there;
#   LAYERS=18 grows it in depth first (each block doubled, the copy starting as the identity): the CPU cycles
#   plateaued at 256 px on the layout, not the texture, and depth is the capacity a lease can add (an 18-layer
#   export is about twice v3's size: ship it by replacing, within the zoo's 60 MB);
# - zoo_ar_v2: the CPU recipe of record (world big, 49152 scenes, 64 + 128 px, object weight 2, EMA, compiled
#   training) with a GPU's batch (128 scenes, 4000 batches: the same 10 epochs; lr x2, warm-up and EMA horizon
#   scaled with the batch count; 9 layers from the start, the shipped model's shape).
# Either stops after MAX_TIME of training if unfinished, then exports and runs the AR report beside the shipped
# model's, both at the same guidance (GenEval at each size on 200 held-out prompts; FD-VGG here only: the VGG
# trunk's source is too large to travel). `smoke` runs every step shrunk here, on the CPU.
#
#   scripts/zoo_gpu.sh wheels     # here, once: the Python packages the GPU machine lacks -> .whl/ (git-ignored)
#   scripts/zoo_gpu.sh            # there, through the device tool with carry [".whl"], timeout_s 600 (or the
#                                 # whole lease in one call: scripts/gpu_lease.sh);
#                                 # what to keep lands in $OUT (export, report, logs: at most 8 files)
#   scripts/zoo_gpu.sh smoke      # here: the same steps on 2 shards and 4 batches, on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="hydra-core==1.3.2 omegaconf==2.3.0 webdataset==1.0.2 braceexpand==0.1.7 threadpoolctl==3.6.0"

if [ "${1:-}" = wheels ]; then
    grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl $WHEELS
    python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # omegaconf's parser: an sdist only
    ls .whl
    exit 0
fi

source scripts/device_python.sh

EXPERIMENT=${EXPERIMENT:-zoo_ar_v3}
RUN=${RUN:-/tmp/${EXPERIMENT}_gpu}
OUT=${OUT:-$RUN/out}
TRAIN=("experiment=$EXPERIMENT" "hydra.run.dir=$RUN" "logger.save_dir=$RUN/logs" "data.synth.dir=$RUN/shards"
       "data.token_cache=$RUN/tokens" "trainer.max_time=${MAX_TIME:-00:00:05:00}")
if [ "$EXPERIMENT" = zoo_ar_v2 ]; then
    SHIPPED=synthscenes_ar_v2  # what the report compares the export against
    TRAIN+=(model.optim.lr=2e-3 model.ema=0.996 model.transformer.layers=9)
    GPU=(data.batch_size=128 model.train.batches=4000 model.optim.warmup_batches=50)
else  # zoo_ar_v3: a fine-tuning, at 4x the CPU recipe's batch (LAYERS at least INIT's depth: it only grows)
    SHIPPED=synthscenes_ar_v3
    TRAIN+=(model.optim.lr=6e-4 model.ema=0.996 "model.init_from=${INIT:-synthscenes_ar_v3}"
            "model.transformer.layers=${LAYERS:-9}")
    GPU=(data.batch_size=64 model.train.batches=3000 model.optim.warmup_batches=50)
fi
if [ "${1:-}" = smoke ]; then
    TRAIN+=(trainer=cpu data.synth.train_shards=2 data.synth.per_shard=64 data.batch_size=16 model.train.batches=4
            model.train.val_every=2 model.train.ckpt_every=2 model.train.val_batches=1 model.optim.warmup_batches=0
            model.compile=false)
    REPORT=(--n 8 --batch 8)
    rm -rf "$RUN"
else
    TRAIN+=(trainer=gpu "${GPU[@]}" model.train.val_every=500 model.train.ckpt_every=500)
    REPORT=(--n 200 --batch 50)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
fi
mkdir -p "$OUT"

SECONDS=0
"$PY" train.py "${TRAIN[@]}" 2>&1 | tr '\r' '\n' | grep -v "it/s" | tee "$OUT/train.log"
echo "trained in ${SECONDS} s" | tee -a "$OUT/train.log"
"$PY" -m mulosd.reports.ar --models "$RUN/export,$SHIPPED" --cfg-scale 7 "${REPORT[@]}" 2>&1 | tr '\r' '\n' | grep -v "it/s" \
    | tee "$OUT/report.txt"
echo "total ${SECONDS} s" | tee -a "$OUT/report.txt"
cp "$RUN"/export/* "$OUT/"
cp "$(ls -t "$RUN"/logs/*/version_*/metrics.csv 2>/dev/null | head -1 || find "$RUN/logs" -name metrics.csv | head -1)" \
    "$OUT/metrics.csv" 2>/dev/null || true
ls -la "$OUT"
