import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from mulosd.ar import Transformer, TransformerConfig
from mulosd.config import register_configs
from mulosd.data.synthscenes.encoder import SceneCaptionEncoder
from mulosd.data.synthscenes.shards import write_split
from mulosd.paths import ROOT
from mulosd.samplers import LatentDownsampler, LatentUpsampler
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.zoo import save, save_ar, tokenizer_digest

os.environ.setdefault("WANDB_MODE", "disabled")
register_configs()


def assert_quiet_logs(result, log_file: Path) -> None:
    """What an entry point prints: each INFO event once, none of the filtered third-party warnings, and the
    run's log file holding every line it printed through logging."""
    import re

    from mulosd.logs import IGNORED_WARNINGS

    everything = result.stdout + result.stderr
    for once in ("GPU available", "trained ", "exported ->"):
        assert everything.count(once) <= 1, f"{once!r} printed {everything.count(once)} times"
    for pattern, _why in IGNORED_WARNINGS:
        assert not re.search(pattern, result.stderr), pattern
    assert "Tip:" not in everything
    logged = log_file.read_text()
    for line in ("trained ", "exported ->", "speedup=", "judge:"):
        for printed in (x.strip() for x in result.stdout.splitlines() if line in x):
            assert printed in logged, printed


def cli_error(script: str, overrides: list[str], run_dir: Path, capsys) -> int:
    """`python SCRIPT OVERRIDES` up to its first refusal, in-process: group choices, composition, validation
    and the run itself, under the entry points' own `exit_on_config_error`; returns the exit status (0 when
    nothing was refused) and leaves the printed error in capsys."""
    import pytest

    from mulosd import bench, inference, training
    from mulosd.config import check_group_choices, check_model_chosen, exit_on_config_error

    name, run = {"train.py": ("train", training.run), "infer.py": ("infer", inference.run),
                 "bench.py": ("bench", bench.run)}[script]
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        with exit_on_config_error():
            check_group_choices(overrides)
            if script == "train.py":
                check_model_chosen(overrides)
            run(compose_config(name, overrides), run_dir)
        raise SystemExit(0)
    return e.value.code


def compose_config(name: str, overrides=()):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture(scope="session")
def synth_shards(tmp_path_factory) -> Path:
    """Two small SynthScenes shards of 64 px scenes (16 each)."""
    out = tmp_path_factory.mktemp("shards")
    write_split(out, "train", 2, 16, 64, seed=3, workers=1, progress=False)
    return out


TINY_SAMPLE = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


TINY_CODES = 128  # more than the default pool_k (64) neighbours


def _tiny_tokenizer(path, seed):
    torch.manual_seed(seed)
    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=TINY_CODES)).eval()
    return save(m, "vq_tokenizer", path, recipe="test"), m


def _tiny_ar(path, tok_path, resolution, dim=32, resolutions=()):
    cfg = TransformerConfig(vocab_size=TINY_CODES, grid=resolution // 8, dim=dim, layers=1, heads=2, cond_dim=16,
                            grids=tuple(r // 8 for r in resolutions))
    model, enc = Transformer(cfg), SceneCaptionEncoder(16)
    save_ar(model, enc, path, recipe="test",
            tokenizer=str(tok_path), tokenizer_sha256=tokenizer_digest(tok_path), resolution=resolution,
            sample=TINY_SAMPLE, resolutions=list(resolutions) or [resolution])


def _tiny_sampler(path, model, stage):
    save(model, "sampler", path, recipe="test", stage=stage)


@pytest.fixture(scope="session")
def tiny_zoo(tmp_path_factory):
    """Random-weight models with the zoo's layout: tokenizer, verifier 128 px, drafter 64 px, small drafter,
    a multi-resolution 64 + 128 px model, r=2 samplers, and an up-sampler trained on another tokenizer."""
    root = tmp_path_factory.mktemp("zoo")
    tok_path, tok = _tiny_tokenizer(root / "tok", 0)
    _tiny_ar(root / "ar128", tok_path, 128)
    _tiny_ar(root / "ar64", tok_path, 64)
    _tiny_ar(root / "small", tok_path, 128, dim=16)
    _tiny_ar(root / "multi", tok_path, 128, resolutions=(64, 128))
    _tiny_sampler(root / "up", LatentUpsampler(tok.codebook(), 2, 16, 1, head="latent"), "gan")
    _tiny_sampler(root / "down", LatentDownsampler(tok.codebook(), 2, 16, 1), "token_ce")
    other_path, other = _tiny_tokenizer(root / "other_tok", 1)
    _tiny_sampler(root / "up_other", LatentUpsampler(other.codebook(), 2, 16, 1, head="latent"), "gan")
    return root
