"""Every parameter value of every W&B sweep composes and validates as a Hydra override, and each sweep's
first grid point runs (offline, on the tiny random zoo)."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mulosd.config.infer import validate_infer
from mulosd.config.train import validate_train

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


MODE_KEYS = {"wandb", "logger.mode"}  # online for the W&B agent, offline in the header's multirun


def _offline_command(path: Path) -> tuple[str, list[str]]:
    """The Hydra multirun command in the sweep file's header: (script, overrides)."""
    line = next(x for x in path.read_text().splitlines() if x.startswith("#   python "))
    _, script, flag, *overrides = line[1:].split()
    assert flag == "-m"
    return script, overrides


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_the_offline_command_in_each_header_is_the_sweep_grid_logged_offline(path):
    sweep = _load(path)
    script, overrides = _offline_command(path)
    assert script == sweep["program"]
    header = dict(o.split("=", 1) for o in overrides)
    grid = {k: ",".join(map(str, p.get("values", [p.get("value")]))).lower() for k, p in sweep["parameters"].items()}
    assert {k: v.lower() for k, v in header.items() if k not in MODE_KEYS} == \
        {k: v for k, v in grid.items() if k not in MODE_KEYS}
    assert [header[k] for k in MODE_KEYS & set(header)] == ["offline"]


@pytest.mark.slow
def test_the_offline_inference_sweep_keeps_the_repository_clean(tiny_zoo, tmp_path, two_prompts):
    """The header's multirun, cut to its first point: it runs, its W&B run lands in the job's directory, and
    nothing appears in the repository (a ./wandb/ there once broke `make lint`)."""
    before = {p.name for p in ROOT.iterdir()}
    script, overrides = _offline_command(ROOT / "sweeps" / "tau.yaml")
    first = [o.split(",")[0] for o in overrides if not o.startswith("prompt_file=")]
    args = [*first, f"prompt_file={two_prompts}", "compare_repeats=1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
            f"models.tokenizer={tiny_zoo / 'tok'}", f"models.verifier={tiny_zoo / 'ar128'}",
            f"models.drafter={tiny_zoo / 'ar64'}", f"models.up={tiny_zoo / 'up'}", f"models.down={tiny_zoo / 'down'}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    r = subprocess.run([sys.executable, script, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "speedup=" in r.stdout
    assert list((tmp_path / "sweep" / "0" / "wandb").glob("offline-run-*")), "the summary was logged offline"
    assert {p.name for p in ROOT.iterdir()} == before
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "train.py", "infer.py", "bench.py",
                           "notebooks"], cwd=ROOT, capture_output=True, text=True, timeout=120)  # what make lint runs
    assert lint.returncode == 0, lint.stdout[-2000:]


@pytest.mark.slow
def test_first_point_of_the_loss_sweep_runs(tmp_path, tmp_path_factory):
    from mulosd.tokenizer import VQConfig, VQModel
    from mulosd.zoo import save

    tok = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32))
    save(tok, "vq_tokenizer", tmp_path / "tok", recipe="test")
    first = [o for o in _grid(_load(ROOT / "sweeps" / "losses.yaml"))[0] if not o.startswith("logger.mode=")]
    args = [*first, f"model.tokenizer={tmp_path / 'tok'}", f"hydra.run.dir={tmp_path / 'run'}", "logger=none",
            f"data.synth.dir={tmp_path_factory.getbasetemp() / 'sweep_shards'}", "data.synth.train_shards=1",
            "data.synth.val_shards=1", "data.synth.per_shard=8", "data.synth.size=64", "data.image_size=64",
            "data.batch_size=4", "model.width=16", "model.depth=1", "trainer.fast_dev_run=2"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 2 batches" in r.stdout
