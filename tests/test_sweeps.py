"""Every parameter value of every W&B sweep composes and validates as a Hydra override, and each sweep's
first grid point runs (offline, on the tiny random zoo)."""

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mulosd.config import validate_infer, validate_train

from .conftest import ROOT, compose_config

SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
CONFIG = {"infer.py": ("infer", validate_infer), "train.py": ("train", validate_train)}


def _load(path: Path) -> dict:
    sweep = yaml.safe_load(path.read_text())
    assert sweep["command"][-1] == "${args_no_hyphens}", "sweeps pass Hydra overrides"
    return sweep


def _override(key, value) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def _grid(sweep: dict) -> list[list[str]]:
    params = sweep["parameters"]
    keys = list(params)
    values = [p["values"] if "values" in p else [p["value"]] for p in params.values()]
    return [[_override(k, v) for k, v in zip(keys, combo, strict=True)] for combo in itertools.product(*values)]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_sweep_value_composes_and_validates(path):
    sweep = _load(path)
    name, validate = CONFIG[sweep["program"]]
    fixed = [_override(k, p["value"]) for k, p in sweep["parameters"].items() if "value" in p]
    for key, p in sweep["parameters"].items():
        for value in p.get("values", []):
            overrides = [o for o in fixed if not o.startswith(key + "=")] + [_override(key, value)]
            cfg = compose_config(name, overrides)
            validate(cfg)
            if key == "loss":  # the command-line group choice wins over the experiment's default
                assert cfg.model.loss.stage == value
    assert len(_grid(sweep)) > 1


@pytest.fixture()
def two_prompts(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("a red circle above a blue square\ntwo dotted rings\n")
    return f


def test_first_point_of_the_inference_sweep_runs(tiny_zoo, tmp_path, two_prompts, monkeypatch):
    first = _grid(_load(ROOT / "sweeps" / "tau.yaml"))[0]
    first = [o for o in first if not o.startswith(("prompt_file=", "wandb="))]
    args = [*first, f"prompt_file={two_prompts}", "wandb=offline", f"out_dir={tmp_path}",
            f"hydra.run.dir={tmp_path / 'h'}", f"models.tokenizer={tiny_zoo / 'tok'}",
            f"models.verifier={tiny_zoo / 'ar128'}", f"models.drafter={tiny_zoo / 'ar64'}",
            f"models.up={tiny_zoo / 'up'}", f"models.down={tiny_zoo / 'down'}"]
    r = subprocess.run([sys.executable, "infer.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "WANDB_DIR": str(tmp_path), "WANDB_MODE": "offline"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "speedup=" in r.stdout.strip().splitlines()[-1] or "speedup=" in r.stdout
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the summary was logged to W&B (offline)"


def test_first_point_of_the_loss_sweep_runs(tmp_path, tmp_path_factory):
    from mulosd.tokenizer import VQConfig, VQModel
    from mulosd.zoo import save

    tok = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32))
    save(tok, "vq_tokenizer", tok.config.to_dict(), tmp_path / "tok", recipe="test")
    first = [o for o in _grid(_load(ROOT / "sweeps" / "losses.yaml"))[0] if not o.startswith("logger.mode=")]
    args = [*first, f"model.tokenizer={tmp_path / 'tok'}", f"hydra.run.dir={tmp_path / 'run'}", "logger=none",
            f"data.synth.dir={tmp_path_factory.getbasetemp() / 'sweep_shards'}", "data.synth.train_shards=1",
            "data.synth.val_shards=1", "data.synth.per_shard=8", "data.synth.size=64", "data.image_size=64",
            "data.batch_size=4", "model.width=16", "model.depth=1", "trainer.fast_dev_run=2"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 2 batches" in r.stdout
