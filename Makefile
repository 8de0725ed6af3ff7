# `make test` is the README's test command and what CI runs.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: setup demo test lint clean

setup: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml
	python3.11 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(VENV_STAMP)

demo: setup
	$(PY) -m mulosd.data.synthscenes preview --out outputs/preview.png

test: setup
	.venv/bin/ruff check src tests train.py infer.py
	$(PY) -m pytest -q

lint: setup
	.venv/bin/ruff check src tests train.py infer.py

clean:
	rm -rf .venv outputs .pytest_cache
