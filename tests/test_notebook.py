"""The walkthrough notebook runs top to bottom (on a random tiny zoo) and draws its pictures."""

import json

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import ROOT

pytestmark = pytest.mark.slow  # end to end: real interpreters, real training or decoding


def test_walkthrough_notebook_runs_and_draws_every_step(tiny_zoo, monkeypatch):
    overrides = [f"models.tokenizer={tiny_zoo / 'tok'}", f"models.verifier={tiny_zoo / 'ar128'}",
                 f"models.drafter={tiny_zoo / 'ar64'}", f"models.up={tiny_zoo / 'up'}",
                 f"models.down={tiny_zoo / 'down'}", f"models.small={tiny_zoo / 'small'}", "tau=0.05"]
    monkeypatch.setenv("MULOSD_NOTEBOOK_MODELS", json.dumps(overrides))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(ROOT / "notebooks" / "walkthrough.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5  # draft | up-sampled, acceptance, islands | committed, all rounds, vs AR
    text = "".join(o.get("text", "") for o in outputs)
    assert "mulosd:" in text and "sequential steps: ar" in text and "rejected" in text
