"""python infer.py end to end on a tiny zoo made here (random weights: the plumbing, not the quality):
every strategy, compare=true with its last line, acceptance maps, and refusals before any decoding."""

import re
import subprocess
import sys

import pytest
import torch

from mulosd.ar import SceneCaptionEncoder, Transformer, TransformerConfig
from mulosd.data.tokens import tokenizer_digest
from mulosd.samplers import LatentDownsampler, LatentUpsampler
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.zoo import save

from .conftest import ROOT

SAMPLE = {"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def _tokenizer(path, seed):
    torch.manual_seed(seed)
    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    return save(m, "vq_tokenizer", m.config.to_dict(), path, recipe="test"), m


def _ar(path, tok_path, resolution, dim=32):
    cfg = TransformerConfig(vocab_size=32, grid=resolution // 8, dim=dim, layers=1, heads=2, cond_dim=16)
    model, enc = Transformer(cfg), SceneCaptionEncoder(16)
    save(torch.nn.ModuleDict({"model": model, "encoder": enc}), "ar",
         {"transformer": cfg.__dict__, "encoder": "synthscenes_slots"}, path, recipe="test",
         tokenizer=str(tok_path), tokenizer_sha256=tokenizer_digest(tok_path), resolution=resolution, sample=SAMPLE)


def _sampler(path, model, kind, stage):
    config = {"kind": kind, "r": 2, "width": 16, "depth": 1, "stage": stage}
    save(model, "sampler", config, path, recipe="test")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    tok_path, tok = _tokenizer(root / "tok", 0)
    _ar(root / "ar128", tok_path, 128)
    _ar(root / "ar64", tok_path, 64)
    _ar(root / "small", tok_path, 128, dim=16)
    _sampler(root / "up", LatentUpsampler(tok.codebook(), 2, 16, 1, head="latent"), "up", "gan")
    _sampler(root / "down", LatentDownsampler(tok.codebook(), 2, 16, 1), "down", "token_ce")
    other_path, other = _tokenizer(root / "other_tok", 1)
    _sampler(root / "up_other", LatentUpsampler(other.codebook(), 2, 16, 1, head="latent"), "up", "gan")
    return root


def _infer(zoo, tmp_path, *extra):
    args = [f"models.tokenizer={zoo / 'tok'}", f"models.verifier={zoo / 'ar128'}", f"models.drafter={zoo / 'ar64'}",
            f"models.small={zoo / 'small'}", f"models.up={zoo / 'up'}", f"models.down={zoo / 'down'}",
            f"out_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'h'}", *extra]
    return subprocess.run([sys.executable, "infer.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_mulosd_with_compare_writes_images_maps_and_the_speedup_line(zoo, tmp_path):
    r = _infer(zoo, tmp_path, "prompts=[a red circle above a blue square,three dotted rings]", "compare=true",
               "tau=0.05")
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"speedup=\d+\.\d\d judge_mulosd=\d\.\d{3} judge_ar=\d\.\d{3}", last), last
    for name in ("000.png", "001.png", "grid.png", "grid_ar.png", "acceptance_000.png"):
        assert (tmp_path / name).is_file(), name
    assert "mulosd:" in r.stdout and "sequential steps" in r.stdout


@pytest.mark.parametrize("decoding", ["ar", "zipar", "sd", "lantern"])
def test_every_baseline_decodes_through_infer(zoo, tmp_path, decoding):
    r = _infer(zoo, tmp_path, f"decoding={decoding}", "prompt=two crosses", "batch_size=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "000.png").is_file() and f"{decoding}" in r.stdout


@pytest.mark.parametrize("override,key", [
    ("tau=1.5", "tau"), ("tau=nan", "tau"), ("r=3", "r"), ("prompt=a purple unicorn", "prompt"),
    ("models.up=UP_OTHER", "models.up"), ("models.verifier=/nonexistent", "models.verifier"),
    ("radius=-1", "radius"), ("stage=adversarial", "stage"),
])
def test_bad_requests_fail_before_decoding_with_one_line(zoo, tmp_path, override, key):
    r = _infer(zoo, tmp_path, override.replace("UP_OTHER", str(zoo / "up_other")))
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"error: {key}" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 10
    assert not (tmp_path / "000.png").exists()
