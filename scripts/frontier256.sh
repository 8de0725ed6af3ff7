#!/usr/bin/env bash
# The frontier at 256 px on one world of prompts (docs/frontier256/README.md): the quality run (2000 prompts at
# batch 8), then the speed run (400 prompts at batch 1), each as two shards, one per core, writing one cells.jsonl.
# Both outlast a session, and the machine (with every run folder outside the repository) may be replaced between
# sessions, so a run folder that is new starts from the cells committed under docs/frontier256/PHASE_WORLD, and
# the speed run starts by itself once both quality shards have finished theirs. Rerun it after any stop: finished
# cells are skipped. The world is always named: the report world is a choice made on the command line.
#
#   nohup scripts/frontier256.sh WORLD >> ../runs/frontier256.log 2>&1 &
#   RUNS=/path/outside/the/repo scripts/frontier256.sh WORLD
#   scripts/frontier256.sh WORLD quality            # one phase only (quality or speed)
#
# Nothing is read from a run until it is complete: a partial run ranks nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-../runs/frontier256}
WORLD=${1:-}
[[ $WORLD =~ ^[0-9]+$ ]] || { echo "error: name the world of prompts (a prompt seed): scripts/frontier256.sh WORLD [PHASE ...]" >&2; exit 2; }
shift
PHASES=("$@")
[ $# -gt 0 ] || PHASES=(quality speed)
for phase in "${PHASES[@]}"; do
    [[ $phase == quality || $phase == speed ]] || { echo "error: unknown phase '$phase' (quality or speed)" >&2; exit 2; }
done
# every point of the frontier, each chosen on the development worlds (docs/results.md)
POINTS=('strategies=[zipar,sjd,pjd,mulosd]' 'windows=[2,3,4,5,6,7,8]' 'sjd_windows=[16]' 'sjd_couplings=[gumbel]'
        'pjd_windows=[8]' 'pjd_starts=[2]' 'rs=[2]' 'taus=[0.5]' 'radii=[2]' infer.size=256
        infer.models.verifier=synthscenes_ar_v3 "prompt_seed=$WORLD" fd=false
        '+variants.default={}' '+variants.t025={tau:0.25}' '+variants.t1={tau:1.0}' '+variants.r1={radius:1}'
        '+variants.r0={radius:0}' '+variants.resample={expanded:resample}' '+variants.ce={stage:token_ce}'
        '+variants.d8={draft_rows:8}' '+variants.x4={r:4}' '+variants.dw2={draft_window:2}'
        '+variants.dw3rw1={draft_window:3,resample_window:1}')
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1

run_phase() {  # NAME OVERRIDE...: both shards of one phase; fails when either does
    local name=$1 folder=$RUNS/${1}_$WORLD committed=docs/frontier256/${1}_$WORLD pids=() failed=0
    shift
    mkdir -p "$folder"
    if [ ! -f "$folder/cells.jsonl" ] && [ -f "$committed/cells.jsonl" ]; then
        cp "$committed/cells.jsonl" "$folder/"
        echo "$name: resumed from $(wc -l < "$committed/cells.jsonl") committed cells ($committed)"
    fi
    for i in 1 2; do
        echo "$name: shard $i/2 -> $folder/shard$i.log"
        nice -n 5 "$PY" bench.py "${POINTS[@]}" "$@" "out_dir=$folder" "shard=$i/2" >> "$folder/shard$i.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    if [ "$failed" = 1 ]; then
        echo "$name: a shard failed (see $folder/shard*.log); the phase after it is not started" >&2
        return 1
    fi
    echo "$name: complete ($(wc -l < "$folder/cells.jsonl") cells in $folder/cells.jsonl)"
}

for phase in "${PHASES[@]}"; do
    case $phase in
        quality) run_phase quality n_prompts=2000 batch_size=8 ;;
        # timed on one thread a shard, on cores nothing else uses: each point against `ar` in its own batches
        speed) run_phase speed n_prompts=400 batch_size=1 infer.threads=1 ;;
    esac
done
