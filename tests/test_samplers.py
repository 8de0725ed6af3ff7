"""Samplers: row-causality, shapes, the four experiments end to end, GAN warm-up in batches, exact resume,
codebook checks on load, the pixel-space path and the ablation report."""

import subprocess
import sys

import pytest
import torch

from mulosd.samplers import LatentDownsampler, LatentUpsampler, PixelUpsampler
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.zoo import load_sampler, save

from .conftest import ROOT, assert_quiet_logs, compose_config

CODEBOOK = torch.randn(64, 8)


@pytest.mark.parametrize("r", [2, 4])
@pytest.mark.parametrize("head", ["logits", "latent"])
def test_upsampler_is_row_causal_with_the_right_shapes(r, head):
    torch.manual_seed(0)
    up = LatentUpsampler(CODEBOOK, r, width=16, depth=2, head=head).eval()
    low = torch.randint(0, 64, (2, 5, 4))
    base = up(low)
    assert base.shape == (2, 64 if head == "logits" else 8, 5 * r, 4 * r)
    assert up.up(low).shape == (2, 5 * r, 4 * r)
    for j in range(5):
        changed = low.clone()
        changed[:, j] = (changed[:, j] + 1) % 64
        diff = (up(changed) - base).abs().amax(dim=(0, 1, 3))
        assert (diff[:r * j] == 0).all(), f"low row {j} leaked into output rows above {r * j}"
        assert (diff[r * j:r * j + r] > 0).all(), "a low row must influence its own output rows"


@pytest.mark.parametrize("r", [2, 4])
def test_downsampler_reads_only_committed_rows(r):
    torch.manual_seed(0)
    down = LatentDownsampler(CODEBOOK, r, width=16, depth=2).eval()
    high = torch.randint(0, 64, (2, 4 * r, 3 * r))
    base = down(high)
    assert base.shape == (2, 64, 4, 3) and down.down(high).shape == (2, 4, 3)
    for i in range(4 * r):
        changed = high.clone()
        changed[:, i] = (changed[:, i] + 1) % 64
        diff = (down(changed) - base).abs().amax(dim=(0, 1, 3))
        assert (diff[:i // r] == 0).all(), f"high row {i} leaked into low rows above {i // r}"


def test_bad_ratios_and_heads_are_refused():
    with pytest.raises(ValueError):
        LatentUpsampler(CODEBOOK, 3)
    with pytest.raises(ValueError):
        LatentUpsampler(CODEBOOK, 2, head="pixels")
    with pytest.raises(ValueError):
        LatentDownsampler(CODEBOOK, 8)
    with pytest.raises(ValueError):
        LatentDownsampler(CODEBOOK, 2)(torch.zeros(1, 5, 4, dtype=torch.long))


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    torch.manual_seed(0)
    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    return save(m, "vq_tokenizer", tmp_path_factory.mktemp("tok") / "tok", recipe="test")


def test_pixel_upsampler_round_trips_through_the_tokenizer(tiny_tokenizer):
    from mulosd.zoo import load_tokenizer

    tok = load_tokenizer(tiny_tokenizer)
    low = torch.randint(0, 32, (2, 4, 4))
    for sr in ("bicubic", "lanczos"):
        assert PixelUpsampler(tok, 2, sr).up(low).shape == (2, 8, 8)
    assert PixelUpsampler(tok, 4, lambda x, r: torch.nn.functional.interpolate(x, scale_factor=r)).up(low).shape \
        == (2, 16, 16)
    with pytest.raises(ValueError):
        PixelUpsampler(tok, 2, "esrgan")


@pytest.mark.parametrize("head", ["logits", "latent"])
def test_an_upsampler_with_a_base_starts_as_the_pixel_path_and_learns_a_correction(tiny_tokenizer, tmp_path, head):
    from mulosd.zoo import load_tokenizer

    tok = load_tokenizer(tiny_tokenizer)
    torch.manual_seed(0)
    low = torch.randint(0, 32, (3, 4, 4))
    pixel = PixelUpsampler(tok, 2, "bicubic").up(low)
    up = LatentUpsampler(tok.codebook(), 2, width=16, depth=1, head=head, base="bicubic")
    with pytest.raises(ValueError, match="needs its tokenizer"):
        up.up(low)
    assert torch.equal(up.use_tokenizer(tok).up(low), pixel), "untrained, U_r must return the pixel path's tokens"
    opt = torch.optim.Adam(up.parameters(), lr=0.05)
    target = torch.randint(0, 32, pixel.shape)  # tokens the pixel path mostly does not give
    for _ in range(30):
        out = up(low)
        loss = torch.nn.functional.cross_entropy(out, target) if head == "logits" else \
            -(torch.nn.functional.normalize(out, dim=1) * tok.codebook()[target].permute(0, 3, 1, 2)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    moved = up.up(low)
    assert (moved == target).float().mean() > (pixel == target).float().mean() + 0.2, "the correction must learn"
    save(up, "sampler", tmp_path / "up", recipe="test", stage="token_ce" if head == "logits" else "gan")
    loaded = load_sampler(tmp_path / "up", tokenizer=tiny_tokenizer)[0]
    assert loaded.base == "bicubic" and torch.equal(loaded.up(low), moved)


def test_a_stage_starts_only_from_a_sampler_with_its_base(tiny_tokenizer, tmp_path):
    from mulosd.config import ConfigError
    from mulosd.training import build_module
    from mulosd.zoo import load_tokenizer

    up = LatentUpsampler(load_tokenizer(tiny_tokenizer).codebook(), 2, width=16, depth=1, base="bicubic")
    save(up, "sampler", tmp_path / "stage1", recipe="test", stage="token_ce")
    overrides = ["experiment=upsampler_mse_lpips", f"model.tokenizer={tiny_tokenizer}", "model.width=16",
                 "model.depth=1", f"model.init_from={tmp_path / 'stage1'}"]
    with pytest.raises(ConfigError, match="base=bicubic; this run has model.base=none"):
        build_module(compose_config("train", overrides + ["model.base=none"]).model)
    module = build_module(compose_config("train", overrides + ["model.base=bicubic"]).model)
    stage1 = up.trunk[0].block[2].weight
    assert torch.allclose(module.sampler.trunk[0].block[2].weight, stage1, atol=1e-3)  # exported in fp16


def test_the_pixel_stages_ce_weight_adds_stage_ones_loss_on_the_latents_cosines(tiny_tokenizer):
    from mulosd.lit.sampler import CE_SCALE
    from mulosd.training import build_module

    overrides = ["experiment=upsampler_mse_lpips", f"model.tokenizer={tiny_tokenizer}", "model.width=16",
                 "model.depth=1", "model.init_from=null", "model.base=none", "model.loss.ce_weight=0"]
    torch.manual_seed(0)
    module = build_module(compose_config("train", overrides).model)
    weighted = build_module(compose_config("train", overrides + ["model.loss.ce_weight=0.5"]).model)
    weighted.sampler.load_state_dict(module.sampler.state_dict())
    low, high = torch.randint(0, 32, (2, 4, 4)), torch.randint(0, 32, (2, 8, 8))
    batch = {"image": torch.rand(2, 3, 64, 64) * 2 - 1}
    plain, logs, _ = module.generator_loss(batch, low, high)
    total, wlogs, _ = weighted.generator_loss(batch, low, high)
    assert "ce" not in logs
    zn = torch.nn.functional.normalize(module.sampler(low), dim=1)
    ce = torch.nn.functional.cross_entropy(CE_SCALE * torch.einsum("bdhw,vd->bvhw", zn, module.sampler.codebook),
                                           high)
    assert torch.allclose(wlogs["ce"], ce) and torch.allclose(total, plain + 0.5 * ce, atol=1e-5)
    bad = compose_config("train", overrides + ["model.loss.ce_weight=-1"]).model
    from mulosd.config import ConfigError
    from mulosd.config.train import validate_model

    with pytest.raises(ConfigError, match="model.loss.ce_weight"):
        validate_model(bad)


def test_a_base_is_the_up_samplers_alone():
    with pytest.raises(ValueError, match="base"):
        LatentUpsampler(CODEBOOK, 2, base="lanczos")
    from mulosd.config import ConfigError
    from mulosd.config.train import validate_model

    cfg = compose_config("train", ["experiment=downsampler", "model.base=bicubic"])
    with pytest.raises(ConfigError, match="model.base"):
        validate_model(cfg.model)


@pytest.mark.parametrize("experiment", ["upsampler_ce", "upsampler_mse_lpips", "upsampler_gan", "downsampler"])
@pytest.mark.parametrize("r", [2, 4])
def test_experiments_compose_with_either_ratio(experiment, r):
    cfg = compose_config("train", [f"experiment={experiment}", f"r={r}"])
    assert cfg.model.name == "sampler" and cfg.model.r == r
    assert cfg.model.kind == ("down" if experiment == "downsampler" else "up")
    stage = {"upsampler_ce": "token_ce", "upsampler_mse_lpips": "mse_lpips", "upsampler_gan": "gan",
             "downsampler": "token_ce"}[experiment]
    assert cfg.model.loss.stage == stage


def _common(tokenizer, shards):
    return [f"model.tokenizer={tokenizer}", "model.init_from=null", f"data.synth.dir={shards}",
            "data.synth.train_shards=1", "data.synth.val_shards=1", "data.synth.per_shard=8", "data.synth.size=64",
            "data.image_size=64", "data.batch_size=4", "model.width=16", "model.depth=1", "logger=none"]


def _train(run_dir, experiment, *extra):
    cmd = [sys.executable, "train.py", f"experiment={experiment}", f"hydra.run.dir={run_dir}", *extra]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
@pytest.mark.parametrize("experiment,r", [("upsampler_ce", 2), ("upsampler_mse_lpips", 4), ("upsampler_gan", 2),
                                          ("downsampler", 4)])
def test_experiment_runs_a_two_batch_fast_dev_run(experiment, r, tmp_path, tmp_path_factory, tiny_tokenizer):
    shards = tmp_path_factory.getbasetemp() / "sampler_shards"
    res = _train(tmp_path, experiment, *_common(tiny_tokenizer, shards), f"r={r}", "trainer.fast_dev_run=2",
                 "model.loss.image.disc_start=1" if experiment == "upsampler_gan" else "model.depth=1")
    assert "trained 2 batches (8 samples" in res.stdout
    assert_quiet_logs(res, tmp_path / "train.log")
    if experiment != "downsampler":
        assert list((tmp_path / "samples").glob("*.png")), "low-res | draft | ground truth grid"


def _state(path):
    return torch.load(path, weights_only=True, map_location="cpu")


@pytest.mark.slow
def test_gan_warmup_counts_batches(tmp_path, tmp_path_factory, tiny_tokenizer):
    """(Kill-and-resume of every stage is in tests/reliability.)"""
    shards = tmp_path_factory.getbasetemp() / "sampler_shards"
    common = [*_common(tiny_tokenizer, shards), "model.train.batches=8", "model.train.ckpt_every=4",
              "model.train.val_every=100", "model.loss.image.disc_start=3", "data.num_workers=1"]
    common.remove("logger=none")
    _train(tmp_path / "a", "upsampler_gan", *common, "logger=csv", f"logger.save_dir={tmp_path / 'logs'}",
           "trainer.log_every_n_steps=1")
    import csv

    rows = list(csv.DictReader(open(next((tmp_path / "logs").rglob("metrics.csv")))))
    trained = [(int(float(r["train/batches"])), r.get("train/d_loss", "")) for r in rows if r.get("train/batches")]
    d_from = min(b for b, d in trained if d)
    assert d_from == 4, f"with disc_start=3 the discriminator first trains on the 4th batch, not {d_from}"
    assert all(not d for b, d in trained if b < 4) and len(trained) == 8
    last = _state(tmp_path / "a" / "checkpoints" / "last.ckpt")
    assert last["mulosd"]["batches_seen"] == 8
    assert last["global_step"] == 16  # Lightning's counter: two optimizer steps per batch; the warm-up is not it
    # the checkpoint files count batches, not Lightning's optimizer steps
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").glob("*.ckpt")) == ["batch8.ckpt", "last.ckpt"]


@pytest.mark.slow
def test_rerunning_into_a_used_directory_is_refused(tmp_path, tmp_path_factory, tiny_tokenizer):
    shards = tmp_path_factory.getbasetemp() / "sampler_shards"
    args = [*_common(tiny_tokenizer, shards), "model.train.batches=1", "model.train.ckpt_every=1"]
    _train(tmp_path, "downsampler", *args)
    r = subprocess.run([sys.executable, "train.py", "experiment=downsampler", f"hydra.run.dir={tmp_path}", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "already holds a run" in r.stderr


def test_a_sampler_for_another_tokenizer_is_refused(tmp_path, tiny_tokenizer):
    from mulosd.zoo import load_tokenizer

    tok = load_tokenizer(tiny_tokenizer)
    up = LatentUpsampler(tok.codebook(), 2, width=16, depth=1, head="latent")
    save(up, "sampler", tmp_path / "up", recipe="test", stage="mse_lpips")
    loaded, meta = load_sampler(tmp_path / "up", tokenizer=tiny_tokenizer)
    assert loaded.r == 2 and loaded.head_kind == "latent" and meta["stage"] == "mse_lpips"
    torch.manual_seed(1)
    other = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32))
    save(other, "vq_tokenizer", tmp_path / "other", recipe="test")
    with pytest.raises(ValueError, match="codebook"):
        load_sampler(tmp_path / "up", tokenizer=tmp_path / "other")


def test_sampler_names_carry_the_verifier_size():
    """U_r and D_r are trained between one pair of grids: the 256 px verifier's are not zoo v2's 128 px ones."""
    from mulosd.zoo import sampler_name

    assert (sampler_name(2, "gan"), sampler_name(4)) == ("synthscenes_up2_gan", "synthscenes_down4")  # zoo v2
    assert (sampler_name(2, "gan", 256), sampler_name(4, size=256)) == ("synthscenes256_up2_gan",
                                                                         "synthscenes256_down4")


@pytest.mark.slow
def test_report_prints_the_ablation_table(tmp_path, tiny_tokenizer, capsys):
    from mulosd.reports.samplers import main
    from mulosd.zoo import load_tokenizer

    tok = load_tokenizer(tiny_tokenizer)
    for r in (2, 4):
        up = LatentUpsampler(tok.codebook(), r, width=16, depth=1, head="logits")
        save(up, "sampler", tmp_path / f"synthscenes256_up{r}_token_ce", recipe="test", stage="token_ce")
    # samplers named for a 256 px verifier, measured at 128 px (what --size 256 --trained-at 128 does the other way)
    assert main(["--n", "4", "--dir", str(tmp_path), "--tokenizer", str(tiny_tokenizer), "--trained-at", "256",
                 "--out", str(tmp_path / "ablation.md")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("samplers: size=128 r2_ce_acc=") and "r4_gan_lpips=nan" in out[-1]
    assert any("pixel bicubic" in line for line in out) and any("not trained" in line for line in out)
    assert "object half-size 0.075-0.13 of the image side" in out[0]  # the world the samplers were trained in
    assert (tmp_path / "ablation.md").read_text().count("| 2 |") >= 4
    verdicts = [line for line in out if line.startswith(("r=2 token_ce: ", "r=4 token_ce: "))]
    assert len(verdicts) == 2, out
    for line in verdicts:  # "r=2 token_ce: ahead of lanczos (acc 0.123 vs 0.100)"
        ours, theirs = map(float, line.split("(acc ")[1].rstrip(")").split(" vs "))
        assert ("ahead of" in line) == (ours > theirs), line
    # --ratios 4: r = 4's rows alone (a second r measured after the first without redoing it)
    assert main(["--n", "2", "--ratios", "4", "--dir", str(tmp_path), "--tokenizer", str(tiny_tokenizer),
                 "--trained-at", "256", "--out", str(tmp_path / "r4.md")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "r2_ce_acc=nan" in out[-1] and "r4_ce_acc=nan" not in out[-1], out[-1]
    r4 = (tmp_path / "r4.md").read_text()
    assert "| 4 | latent token_ce |" in r4 and "| 2 |" not in r4


def test_report_names_a_ratio_without_samplers_in_one_line(capsys):
    from mulosd.reports.samplers import main

    with pytest.raises(SystemExit):
        main(["--ratios", "3"])
    assert "--ratios: the samplers exist for r = 2 and 4, got [3]" in capsys.readouterr().err


def _owned_config_models():
    from mulosd.ar import Transformer, TransformerConfig
    from mulosd.tokenizer import VQConfig, VQModel

    codebook = torch.randn(32, 8)
    return [VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)),
            Transformer(TransformerConfig(vocab_size=32, grid=4, dim=32, layers=1, heads=2, cond_dim=16, grids=(2, 4))),
            LatentUpsampler(codebook, 4, width=16, depth=2, head="latent"),
            LatentUpsampler(codebook, 2, width=16, depth=1, head="logits"),
            LatentUpsampler(codebook, 2, width=16, depth=1, head="logits", base="bicubic"),
            LatentDownsampler(codebook, 2, width=16, depth=3)]


@pytest.mark.parametrize("model", _owned_config_models(), ids=lambda m: type(m).__name__)
def test_every_model_class_rebuilds_itself_from_its_saved_config(model):
    import json

    from mulosd.samplers import build_sampler

    config = json.loads(json.dumps(model.to_config()))  # what config.json holds
    if isinstance(model, LatentUpsampler | LatentDownsampler):
        again = build_sampler(config, model.codebook)
    else:
        again = type(model).from_config(config)
    assert again.to_config() == model.to_config()
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


def test_an_export_that_names_its_stage_instead_of_its_head_still_loads():
    from mulosd.samplers import build_sampler

    old = {"kind": "up", "r": 2, "width": 16, "depth": 1, "stage": "token_ce", "codebook_size": 32, "code_dim": 8}
    assert build_sampler(old, torch.randn(32, 8)).head_kind == "logits"
    assert build_sampler(old | {"stage": "gan"}, torch.randn(32, 8)).head_kind == "latent"
