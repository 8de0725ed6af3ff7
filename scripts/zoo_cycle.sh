#!/usr/bin/env bash
# Zoo v2's AR model in training cycles that each fit one session of this machine (docs/log.md, zoo v2): a session
# lasts three hours and the machine, with every run directory outside the repository, may be replaced between
# sessions, so a schedule longer than a session is never finished. Each cycle is a whole schedule (warm-up,
# cosine decay) on the recipe of record (experiment=zoo_ar_v2) over 96 shards of fresh scenes (cycle N trains on
# shards 96(N-1) .. 96N-1 of the same world; validation stays the same), cycle 1 from scratch and cycle N from
# the export of cycle N-1 (model.init_from; the shipped zoo model when the previous run directory is gone).
# Then the sampling defaults are tuned per size on prompt seed 777 and written into the export, and the AR report
# runs on the two reporting prompt sets (4242, the report's default, and 4343) with FD-VGG.
#
#   scripts/zoo_cycle.sh 1                         # -> RUNS/cycle1/export, tune.txt, report4242.txt, report4343.txt
#   scripts/zoo_cycle.sh 2 zoo/synthscenes_ar_v2   # the next cycle, from the shipped model
#   RUNS=/path/outside/the/repo BATCHES=3000 scripts/zoo_cycle.sh 1
#   scripts/zoo_cycle.sh 4 RUNS/cycle3/export model.transformer.layers=9    # more overrides: a deeper model, grown
#   CFGS="10 20" TEMPS=1.0 scripts/zoo_cycle.sh ...                          # a smaller tuning grid
#   SCHEDULES=linear scripts/zoo_cycle.sh ...          # guidance schedules tuned (default: constant and linear)
#   SHARDS=48 BATCHES=900 scripts/zoo_cycle.sh ...     # half the fresh scenes: a machine that tokenises slowly
#   LR=1e-3 scripts/zoo_cycle.sh 2 ...                 # a later cycle's peak learning rate (the default: LR below)
#   EXPERIMENT=zoo_ar_v3 SIZES=256 scripts/zoo_cycle.sh 1 synthscenes_ar_v2   # zoo v3 (64/128/256 px), tuned and
#                                                      # reported at 256 px only (the smaller views: v2's settings)
#   FIRST_SHARD=0 SHARDS=48 scripts/zoo_cycle.sh 2 ... # another pass over cycle 1's scenes (already written and
#                                                      # tokenised) where fresh ones would not fit in the session
#
# A killed cycle resumes exactly from its last checkpoint when rerun; finished steps are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
EXPERIMENT=${EXPERIMENT:-zoo_ar_v2}  # the recipe every cycle trains and re-exports with
# shellcheck disable=SC2206  # a list of numbers
SIZES=(${SIZES:-})                   # tune and report only these sizes (px) of the model (empty: every size)
SIZE_ARGS=(); [ ${#SIZES[@]} -gt 0 ] && SIZE_ARGS=(--sizes "${SIZES[@]}")
RUNS=${RUNS:-../runs/zoo_cycles}
BATCHES=${BATCHES:-2250}  # what trains, tunes and reports inside one session here (docs/log.md, zoo v2)
STRIDE=96                 # cycle N's shards start at STRIDE (N-1), whatever SHARDS a cycle uses
SHARDS=${SHARDS:-$STRIDE}
# a later cycle starts from a trained model: re-warming it to the recipe's peak knocked its raw weights back for most
# of the cycle (only the EMA export kept the cycle's gain); a lower peak does not (docs/log.md, zoo v2, cycle 6)
LR=${LR:-3e-4}
N=${1:?usage: scripts/zoo_cycle.sh N [INIT_FROM [OVERRIDE ...]]}
INIT=${2:-}
EXTRA=("${@:3}")  # Hydra overrides for training and the re-export alike (the architecture's among them)
# validate halfway and at the last batch, where the raw weights and the EMA are compared for the export
VAL=("model.train.val_every=$(( BATCHES / 2 ))")
LRS=("model.optim.lr=$LR")
for o in "${EXTRA[@]}"; do
    [[ $o == model.train.val_every=* ]] && VAL=()
    [[ $o == model.optim.lr=* ]] && LRS=()
done
if [ "$SHARDS" -gt "$STRIDE" ]; then
    echo "error: SHARDS=$SHARDS would reach into the next cycle's shards (at most $STRIDE)" >&2
    exit 2
fi
FIRST_SHARD=${FIRST_SHARD:-$(( (N - 1) * STRIDE ))}  # the cycle's fresh shards unless told others
if [ "$N" -gt 1 ] && [ -z "$INIT" ]; then
    echo "error: cycle $N starts from the previous cycle's export: give it (a run's export/ or a zoo name)" >&2
    exit 2
fi
RUN=$RUNS/cycle$N
mkdir -p "$RUN"
export PYTHONUNBUFFERED=1

if [ ! -f "$RUN/export/config.json" ]; then
    ARGS=("experiment=$EXPERIMENT" "model.train.batches=$BATCHES" "data.synth.train_shards=$SHARDS"
          "data.synth.first_shard=$FIRST_SHARD" "hydra.run.dir=$RUN" "logger.save_dir=$RUN/logs"
          "${VAL[@]}" "${EXTRA[@]}")
    [ -n "$INIT" ] && ARGS+=("model.init_from=$INIT" "${LRS[@]}")
    [ -f "$RUN/checkpoints/last.ckpt" ] && ARGS+=("ckpt_path=$RUN/checkpoints/last.ckpt")
    echo "cycle $N: $PY train.py ${ARGS[*]}"
    "$PY" train.py "${ARGS[@]}" >> "$RUN/train.log" 2>&1
fi
# the copy the cycle ships: the raw weights where they beat the EMA at the last validation (a short schedule's EMA
# still carries its early weights); the EMA export is kept beside it
if [ ! -f "$RUN/tune.txt" ] && [ ! -d "$RUN/export_ema" ]; then
    better=$("$PY" - "$RUN"/logs/*/version_*/metrics.csv <<'PY'
import csv, re, sys
files = sorted(sys.argv[1:], key=lambda f: int(re.search(r"version_(\d+)", f).group(1)))
last = [r for f in files for r in csv.DictReader(open(f)) if r.get("val/ce") and r.get("val/ce_raw")][-1]
print("raw" if float(last["val/ce_raw"]) < float(last["val/ce"]) else "ema")
PY
)
    if [ "$better" = raw ]; then
        mv "$RUN/export" "$RUN/export_ema"
        "$PY" train.py "experiment=$EXPERIMENT" task=export model.export_weights=raw "model.train.batches=$BATCHES" \
            "ckpt_path=$RUN/checkpoints/last.ckpt" "hydra.run.dir=$RUN" "${EXTRA[@]}" >> "$RUN/train.log" 2>&1
    fi
fi
# the grid around what cycle 1 picked, the highest guidance it tried, at a constant scale and on the linear ramp
# (docs/log.md, zoo v2)
if [ ! -f "$RUN/tune.txt" ]; then
    # shellcheck disable=SC2086  # the grids are lists of numbers
    "$PY" -m mulosd.reports.ar_tune --model "$RUN/export" --prompt-seed 777 --cfg ${CFGS:-7 10 14 20} \
        --temperature ${TEMPS:-0.7 1.0} --schedule ${SCHEDULES:-constant linear} "${SIZE_ARGS[@]}" --write \
        | tee "$RUN/tune.tmp"
    mv "$RUN/tune.tmp" "$RUN/tune.txt"
fi
for seed in 4242 4343; do
    if [ ! -f "$RUN/report$seed.txt" ]; then
        "$PY" -m mulosd.reports.ar --models "$RUN/export" --prompt-seed "$seed" --fd --radius 0.11 0.145 \
            "${SIZE_ARGS[@]}" | tee "$RUN/report$seed.tmp"
        mv "$RUN/report$seed.tmp" "$RUN/report$seed.txt"
    fi
done
