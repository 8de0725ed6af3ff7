import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mulosd.data.images import to_tensor
from mulosd.data.synthscenes import render, sample_scene
from mulosd.eval.pixels import psnr
from mulosd.paths import ZOO
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.tokenizer.neighbours import cached_neighbour_table, neighbour_table
from mulosd.zoo import load_tokenizer

from .conftest import ROOT

TINY = ["model.vq.ch=8", "model.vq.ch_mult=[1,1,1,2]", "model.vq.z_channels=16", "model.vq.codebook_size=64",
        "model.loss.disc_ndf=8", "model.train.crop=32", "data.image_size=64", "data.batch_size=4",
        "logger=none", "trainer.enable_progress_bar=false",
        "model.optim.decay_batches=5"]  # the recipe's lr decay, over the last 5 batches: resume goes through it


@pytest.mark.parametrize("ch_mult, f", [([1, 2, 4, 4], 8), ([1, 1, 2, 2, 4], 16)])
@pytest.mark.parametrize("size", [32, 64, 128])
def test_encode_decode_shapes(ch_mult, f, size):
    m = VQModel(VQConfig(ch=8, ch_mult=ch_mult, z_channels=16, codebook_size=32))
    x = torch.rand(2, 3, size, size) * 2 - 1
    tokens = m.encode(x)
    assert tokens.shape == (2, size // f, size // f) and tokens.dtype == torch.long
    assert m.decode(tokens).shape == x.shape
    assert m.codebook().shape == (32, 8) and torch.allclose(m.codebook().norm(dim=-1), torch.ones(32))


def test_bad_inputs_are_refused():
    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32))
    with pytest.raises(ValueError, match="multiple of 8"):
        m.encode(torch.zeros(1, 3, 36, 36))
    with pytest.raises(ValueError, match="token ids"):
        m.decode(torch.full((1, 2, 2), 32))


def test_neighbour_table_matches_brute_force(tmp_path):
    cb = torch.nn.functional.normalize(torch.randn(300, 8), dim=-1)
    table = neighbour_table(cb, k=10, chunk=64)
    sims = cb @ cb.T
    for v in range(0, 300, 37):
        order = [i for i in sims[v].argsort(descending=True).tolist() if i != v][:10]
        assert table[v].tolist() == order
    assert (table != torch.arange(300)[:, None]).all()
    cached = cached_neighbour_table(cb, 10, cache_dir=tmp_path)
    assert torch.equal(cached, table) and len(list(tmp_path.iterdir())) == 1
    assert torch.equal(cached_neighbour_table(cb, 10, cache_dir=tmp_path), table)


def _train(run_dir, *extra):
    cmd = [sys.executable, "train.py", "experiment=zoo_tokenizer", f"hydra.run.dir={run_dir}", *TINY, *extra]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokdata")
    return [f"data.synth.dir={d}", "data.synth.train_shards=2", "data.synth.val_shards=1", "data.synth.per_shard=8",
            "data.synth.size=64"]


@pytest.mark.slow
def test_recipe_fast_dev_run_trains_two_batches(tmp_path, tiny_data):
    r = _train(tmp_path, *tiny_data, "trainer.fast_dev_run=2", "model.loss.disc_start=1")
    assert "trained 2 batches" in r.stdout


@pytest.mark.slow
def test_missing_resume_checkpoint_fails_hard(tmp_path, tiny_data):
    r = subprocess.run([sys.executable, "train.py", "experiment=zoo_tokenizer", f"hydra.run.dir={tmp_path}",
                        *TINY, *tiny_data, f"ckpt_path={tmp_path}/nope.ckpt"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "ckpt_path" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not (ZOO / "synthscenes_vq_f8").is_dir(), reason="zoo tokenizer not shipped yet")
def test_shipped_tokenizer_loads_and_reconstructs_fixed_scenes():
    tok = load_tokenizer()
    meta = json.loads((ZOO / "synthscenes_vq_f8" / "config.json").read_text())
    assert meta["kind"] == "vq_tokenizer" and "zoo_tokenizer" in meta["recipe"]
    floors = {32: 18.0, 64: 19.0, 128: 20.0}
    for size, floor in floors.items():
        x = torch.stack([to_tensor(render(sample_scene(4242, i), size)) for i in range(16)])
        with torch.no_grad():
            rec = tok.decode(tok.encode(x))
        assert psnr(rec, x).mean().item() >= floor, size
    assert np.isfinite(tok.codebook().numpy()).all()


def test_report_evaluates_a_tokenizer_and_refuses_a_missing_one(tmp_path):
    from mulosd.reports.tokenizer import evaluate, main
    from mulosd.zoo import save

    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    rows = evaluate(m, n=4, sizes=(32, 64), batch=2, progress=False)
    for r in rows.values():
        assert 0 < r["usage"] <= 1 and 1 <= r["perplexity"] <= 32 and 0 <= r["judge"] <= 1
        assert r["judge_original"] >= 0.5 and r["psnr"] > 0
    save(m, "vq_tokenizer", tmp_path / "tok", recipe="test")
    loaded = load_tokenizer(tmp_path / "tok")
    assert torch.allclose(loaded.codebook(), m.codebook(), atol=1e-3)  # fp16 storage
    assert main(["--tokenizer", str(tmp_path / "nothing")]) == 2


def test_the_report_line_names_each_size_it_measured():
    from mulosd.reports.tokenizer import summary

    row = {"psnr": 29.5, "lpips": 0.04, "judge": 1.0, "usage": 0.9}
    assert summary({256: row, 128: row | {"psnr": 28.97}}) == (
        "tokenizer: psnr128=28.97 psnr256=29.50 lpips128=0.0400 lpips256=0.0400 judge128=1.000 judge256=1.000 "
        "usage256=0.900")


def test_exported_weights_record_their_sha256_and_a_tampered_file_is_refused(tmp_path):
    from mulosd.zoo import file_sha256, save

    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    out = save(m, "vq_tokenizer", tmp_path / "tok", recipe="test")
    assert json.loads((out / "config.json").read_text())["sha256"] == file_sha256(out / "model.safetensors")
    load_tokenizer(out)
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one flipped bit in the last weight
    (out / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256"):
        load_tokenizer(out)


@pytest.mark.parametrize("damage", ["truncated", "not_safetensors", "wrong_shape"])
def test_a_damaged_file_without_a_checksum_is_one_line_not_a_traceback(tmp_path, damage):
    """A config.json without `sha256` (hand-written, or an older export) cannot catch a torn file by hash; the
    loader still names the file in one ValueError (what infer.py turns into `error: models.KEY: ...`)."""
    from mulosd.zoo import save

    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    out = save(m, "vq_tokenizer", tmp_path / "tok", recipe="test")
    meta = json.loads((out / "config.json").read_text())
    del meta["sha256"]
    if damage == "wrong_shape":
        meta["config"]["codebook_size"] = 64
    (out / "config.json").write_text(json.dumps(meta))
    data = (out / "model.safetensors").read_bytes()
    if damage != "wrong_shape":
        (out / "model.safetensors").write_bytes(data[: len(data) // 2] if damage == "truncated" else b"x" * 100)
    with pytest.raises(ValueError, match="model.safetensors") as e:
        load_tokenizer(out)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_loading_models_for_decoding_needs_neither_lightning_nor_the_loss_stack():
    code = ("import sys; from mulosd.zoo import load_ar, load_sampler, load_tokenizer; "
            "load_tokenizer(); load_ar('synthscenes_ar_v2'); load_sampler('synthscenes_up2_gan'); "
            "load_sampler('synthscenes_down2'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'lightning' or m.startswith('mulosd.l')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_every_shipped_model_matches_its_recorded_sha256():
    from mulosd.zoo import file_sha256

    shipped = [d for d in ZOO.iterdir() if (d / "config.json").is_file()]
    assert shipped
    for d in shipped:
        assert json.loads((d / "config.json").read_text())["sha256"] == file_sha256(d / "model.safetensors"), d.name
