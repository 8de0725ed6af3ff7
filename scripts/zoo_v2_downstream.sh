#!/usr/bin/env bash
# Zoo v2 after its AR run (docs/log.md, zoo v2): the small same-resolution drafter of sd / lantern and the up- and
# down-samplers (through their three loss stages) retrained on world "big" (the AR's world), then the
# samplers' report. Each training resumes from its last checkpoint
# and is skipped once exported, so the script can be killed and rerun at any point.
#
#   scripts/zoo_v2_downstream.sh                 # -> RUNS/{up2_token_ce,...,ar128_small,ar32,...,down4}/export
#   RUNS=/path/outside/the/repo scripts/zoo_v2_downstream.sh
#   scripts/zoo_v2_downstream.sh --dry-run       # print the commands only
#   FIRST_SHARD=384 scripts/zoo_v2_downstream.sh # train on world-big shards already written (e.g. by zoo cycles)
#   SIZE=256 RUNS=../runs/zoo_v3 scripts/zoo_v2_downstream.sh   # zoo v3's grids (below)
#   SIZE=256 INIT=../runs/zoo128/ ...            # the 128 px stages to start from, where the zoo no longer ships them
#   RATIOS=4 SIZE=256 ...                        # only these r (default: 2 4)
#
# r=2 (infer.py's default) comes first, then the small drafter, then r=4 (its 32 px drafter and samplers).
#
# The recipes are the shipped ones (conf/experiment/upsampler_*.yaml, downsampler.yaml) with the world changed
# and each stage initialised from the previous stage of this run, not from the shipped zoo.
#
# SIZE=256 trains U_r / D_r between zoo v3's grids (the 256 px verifier's 32 x 32, its 128 / 64 px views' 16 x 16
# and 8 x 8) on the 256 px shards zoo v3's cycles write. The samplers are convolutional, so each stage starts from
# its shipped 128 px counterpart on a short schedule (a 256 px batch costs about four 128 px ones);
# the small drafter and the 32 px drafter are not needed there (the 256 px model drafts with its own 128 / 64 px
# views). The zoo shipped the 128 px r = 4 stages until its 256 px samplers took their room; INIT=DIR/ takes them
# from a folder instead, e.g. from git history:
#   mkdir -p ../runs/zoo128 && git archive dbd8881 zoo/synthscenes_up4_token_ce zoo/synthscenes_down4 \
#       | tar -x -C ../runs/zoo128 --strip-components=1
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-../runs/zoo_v2}
DRY=${1:-}
SIZE=${SIZE:-128}
RATIOS=${RATIOS:-2 4}
WORLD=("data.synth.dir=data/shards/synthscenes${SIZE}_big" "data.synth.radius=[0.11,0.145]"
       "data.synth.first_shard=${FIRST_SHARD:-0}")
SAMPLER_SCENES="data.synth.train_shards=192"  # the small drafter keeps its recipe's 32 shards: it tokenises them all
CE=() MSE=() GAN=() DOWN=()  # each stage's schedule where it is not its recipe's
if [ "$SIZE" = 256 ]; then
  WORLD+=("data.image_size=256" "data.synth.size=256")
  SAMPLER_SCENES="data.synth.train_shards=48"   # what zoo v3's first cycle wrote
  CE=(model.train.batches=250 model.train.val_every=250)
  MSE=(model.train.batches=100 model.train.val_every=100)
  GAN=(model.train.batches=100 model.train.val_every=100 model.loss.image.disc_start=25)
  DOWN=(model.train.batches=150 model.train.val_every=150)
elif [ "$SIZE" != 128 ]; then
  echo "error: SIZE=$SIZE: the samplers train at 128 px (zoo v2) or 256 px (zoo v3)" >&2
  exit 2
fi

train() {  # NAME OVERRIDES...: one training run in RUNS/NAME, resumed if it has a checkpoint
  local name=$1
  shift
  if [ -f "$RUNS/$name/export/config.json" ]; then
    echo "$name: exported already"
    return
  fi
  local resume=()
  if [ -f "$RUNS/$name/checkpoints/last.ckpt" ]; then
    resume=("ckpt_path=$RUNS/$name/checkpoints/last.ckpt")
  fi
  local cmd=("$PY" train.py "$@" "${WORLD[@]}" "hydra.run.dir=$RUNS/$name" "${resume[@]}")
  echo "$name: ${cmd[*]}"
  if [ "$DRY" != "--dry-run" ]; then
    "${cmd[@]}" > "$RUNS/$name.log" 2>&1
    tail -n 1 "$RUNS/$name.log"
  fi
}

mkdir -p "$RUNS"
samplers() {  # R: U_r through its three loss stages, then D_r
  local r=$1 ce_from=() down_from=()
  if [ "$SIZE" = 256 ]; then  # from the shipped 128 px stages
    ce_from=("model.init_from=${INIT:-}synthscenes_up${r}_token_ce")
    down_from=("model.init_from=${INIT:-}synthscenes_down$r")
  fi
  train "up${r}_token_ce" experiment=upsampler_ce "r=$r" "$SAMPLER_SCENES" "${ce_from[@]}" "${CE[@]}"
  train "up${r}_mse_lpips" experiment=upsampler_mse_lpips "r=$r" "model.init_from=$RUNS/up${r}_token_ce/export" \
    "$SAMPLER_SCENES" "${MSE[@]}"
  train "up${r}_gan" experiment=upsampler_gan "r=$r" "model.init_from=$RUNS/up${r}_mse_lpips/export" \
    "$SAMPLER_SCENES" "${GAN[@]}"
  train "down${r}" experiment=downsampler "r=$r" "$SAMPLER_SCENES" "${down_from[@]}" "${DOWN[@]}"
}
wanted() { [[ " $RATIOS " == *" $1 "* ]]; }  # R: is r = R among RATIOS
wanted 2 && samplers 2
if [ "$SIZE" = 128 ]; then
  # exact SD's and LANTERN's same-resolution drafter (the shipped small recipe), on the same world
  train ar128_small experiment=zoo_ar_128_small
  # r=4's 32 px drafter (the shipped recipe, its 32 shards), then U_4 / D_4
  train ar32 experiment=zoo_ar_32
fi
wanted 4 && samplers 4
if [ "$DRY" != "--dry-run" ]; then
  # the report reads samplers by their zoo names from one directory
  mkdir -p "$RUNS/zoo"
  family=synthscenes; [ "$SIZE" = 128 ] || family=synthscenes$SIZE  # mulosd.zoo.sampler_name
  for r in $RATIOS; do
    for stage in token_ce mse_lpips gan; do
      ln -sfn "$(realpath "$RUNS/up${r}_$stage/export")" "$RUNS/zoo/${family}_up${r}_$stage"
    done
    ln -sfn "$(realpath "$RUNS/down$r/export")" "$RUNS/zoo/${family}_down$r"
  done
  "$PY" -m mulosd.reports.samplers --dir "$RUNS/zoo" --radius 0.11 0.145 --size "$SIZE" --ratios $RATIOS \
    | tee "$RUNS/samplers_report.txt"
fi
