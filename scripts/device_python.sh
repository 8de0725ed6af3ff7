# Sourced by the GPU scripts (zoo_gpu.sh, gpu_check.sh): which Python runs them. Here, the project's venv; on the
# device machine (no .venv), its own python3 and PyTorch, the pure-Python packages it lacks carried as wheels in
# .whl/ (`scripts/zoo_gpu.sh wheels`; installed once per machine) and this checkout's sources.
if [ -x .venv/bin/python ]; then
    PY=${PY:-.venv/bin/python}
else
    PY=${PY:-python3}
    if [ -d .whl ] && [ ! -e /tmp/site/.installed ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl && touch /tmp/site/.installed
    fi
    export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
