#!/usr/bin/env bash
# The zoo v2 scaling study (docs/log.md, zoo v2): short 128 px AR trainings at one CPU budget each, one lever
# changed against the base recipe (world v1's zoo_ar_128 recipe), then GenEval on the fixed held-out prompt set.
#
#   scripts/zoo_study.sh [POINT ...]          # default: every point; finished points are skipped
#   STUDY=/path/outside/the/repo scripts/zoo_study.sh base objw4
#
# Two points run at a time, one CPU thread each (on 2 cores that beats one 2-thread run: these matmuls are
# small). Each point's batch count is its budget divided by its own measured seconds per batch on one thread
# (calibrated with `scripts/zoo_study.sh calibrate`), so every point gets the same CPU time.
# Writes STUDY/NAME/{metrics.csv, report.txt, train.log} and STUDY/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STUDY=${STUDY:-../runs/zoo_study}
BUDGET_S=${BUDGET_S:-900}   # CPU seconds (one thread) per point
N_PROMPTS=${N_PROMPTS:-400}  # GenEval prompts per point (200 resolve about +-0.05 between two points, 400 +-0.04)
BIG="data.synth.dir=data/shards/synthscenes128_big data.synth.radius=[0.11,0.145]"

# name | seconds per batch on one thread (calibrated) | overrides
POINTS=(
  "base|1.42|"
  "objw4|1.42|model.object_weight=4"
  "ema|1.42|model.ema=0.99"
  "lr3e-3|1.42|model.optim.lr=3e-3"
  "wide|2.81|model.transformer.dim=256 model.transformer.layers=8 model.transformer.heads=8 model.transformer.cond_dim=256"
  "big|1.42|$BIG"
  "multires|1.79|model.resolutions=[64,128]"
  "bs64|2.84|data.batch_size=64 model.optim.lr=2e-3"
)

train() {  # name batches overrides...
  local name=$1 batches=$2; shift 2
  OMP_NUM_THREADS=1 $PY train.py experiment=zoo_ar_128 logger=csv "logger.save_dir=$STUDY/$name" \
    "hydra.run.dir=$STUDY/$name" "model.train.batches=$batches" "model.train.val_every=$batches" \
    "model.train.ckpt_every=$batches" "model.optim.warmup_batches=$((batches / 10))" data.log_keys=false "$@"
}

point() {  # one study point: train, then the AR report on its export
  local name=$1 spb=$2 over=$3 dir=$STUDY/$1
  [[ -f $dir/report.txt ]] && { echo "$name: done"; return; }
  local batches; batches=$(python3 -c "print(int($BUDGET_S / $spb))")
  mkdir -p "$dir"
  if [[ ! -f $dir/export/config.json ]]; then  # an exported point only needs its report
    # shellcheck disable=SC2086
    /usr/bin/time -v -o "$dir/time.txt" bash -c "$(declare -f train); PY=$PY STUDY=$STUDY train $name $batches $over" \
      > "$dir/train.log" 2>&1
  fi
  OMP_NUM_THREADS=1 $PY -m mulosd.reports.ar --n "$N_PROMPTS" --models "$dir/export" > "$dir/report.txt" \
    2> "$dir/report.log"
  echo "$name: $(tail -1 "$dir/report.txt")"
}

if [[ ${1:-} == calibrate ]]; then  # seconds per training batch (bf16 autocast, batch 32) on one thread
  for arch in "192 6 6 0" "256 8 8 0" "192 6 6 1"; do
    OMP_NUM_THREADS=1 $PY - $arch <<'EOF'
import sys, time, torch
from mulosd.data.synthscenes import caption_text, sample_scene
from mulosd.ar import TransformerConfig
from mulosd.config.train import ARModelConfig, ScheduleConfig
from mulosd.lit.ar import ARModule
dim, layers, heads, multi = (int(x) for x in sys.argv[1:5])
t = TransformerConfig(vocab_size=1024, grid=16, dim=dim, layers=layers, heads=heads, cond_dim=dim,
                      grids=[8, 16] if multi else [])
m = ARModule(ARModelConfig(transformer=t, tokenizer="-", resolution=128, train=ScheduleConfig(batches=1),
                           resolutions=[64, 128] if multi else []))
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
batch = {"tokens": {128: torch.randint(0, 1024, (32, 16, 16)), 64: torch.randint(0, 1024, (32, 8, 8))},
         "caption": [caption_text(sample_scene(0, i).prompt) for i in range(32)]}
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m.loss(batch)
    loss.backward(); opt.step(); opt.zero_grad()
for _ in range(3): step()
t = time.perf_counter()
for _ in range(8): step()
print(f"dim={dim} layers={layers} grids={m.sizes}: {(time.perf_counter() - t) / 8:.2f} s per batch of 32 on one thread")
EOF
  done
  exit 0
fi

want=("$@")
todo=()
for p in "${POINTS[@]}"; do
  IFS='|' read -r name _ _ <<< "$p"
  if [[ ${#want[@]} -eq 0 || " ${want[*]} " == *" $name "* ]]; then todo+=("$p"); fi
done
for ((i = 0; i < ${#todo[@]}; i += 2)); do  # two at a time
  for p in "${todo[@]:i:2}"; do
    IFS='|' read -r name spb over <<< "$p"
    point "$name" "$spb" "$over" &
  done
  wait
done

{
  echo "| point | batches | CPU s | val CE | val CE objects | val CE background | GenEval 128 |"
  echo "|---|---|---|---|---|---|---|"
  for p in "${POINTS[@]}"; do
    IFS='|' read -r name _ _ <<< "$p"
    d=$STUDY/$name
    [[ -f $d/report.txt ]] || continue
    $PY - "$d" <<'EOF'
import csv, glob, re, sys
from pathlib import Path
d = Path(sys.argv[1])
rows = [r for f in glob.glob(str(d / "**/metrics.csv"), recursive=True) for r in csv.DictReader(open(f))]
last = lambda k: next((float(r[k]) for r in reversed(rows) if r.get(k)), float("nan"))
batches = re.search(r"trained (\d+) batches", (d / "train.log").read_text())
t = (d / "time.txt").read_text()
cpu = sum(float(re.search(rf"{k} time \(seconds\): ([0-9.]+)", t).group(1)) for k in ("User", "System"))
g = re.search(r"geneval128=([0-9.]+)", (d / "report.txt").read_text()).group(1)
print(f"| {d.name} | {batches.group(1) if batches else '?'} | {cpu:.0f} | {last('val/ce'):.3f} | "
      f"{last('val/ce_objects'):.3f} | {last('val/ce_background'):.3f} | {g} |")
EOF
  done
} > "$STUDY/summary.md"
cat "$STUDY/summary.md"
