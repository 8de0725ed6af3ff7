"""The pixel path's learned super-resolution: checkpoints in Real-ESRGAN's own file layouts read through spandrel
(tiny random weights, offline), the framework's SR network trained, exported and read back through the same
path, and one-line refusals for what cannot work."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from mulosd.config.train import SamplerLossConfig, SamplerModelConfig
from mulosd.samplers import PixelUpsampler
from mulosd.samplers.sr import sr_network
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.zoo import load_sr, load_tokenizer, save

from .test_samplers import _common, _train


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    torch.manual_seed(0)
    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    return save(m, "vq_tokenizer", tmp_path_factory.mktemp("tok") / "tok", recipe="test")


def rrdbnet_state(scale: int, nf: int = 8, gc: int = 32, blocks: int = 1) -> dict:
    """Real-ESRGAN's RRDBNet (RealESRGAN_x4plus.pth), keys as its code names them, random weights (the growth
    channels gc are upstream's fixed 32)."""
    g = torch.Generator().manual_seed(scale)
    conv = lambda cout, cin: {"weight": torch.randn(cout, cin, 3, 3, generator=g) * 0.05,  # noqa: E731
                              "bias": torch.zeros(cout)}
    parts = {"conv_first": conv(nf, 3)}
    for b in range(blocks):
        for d in (1, 2, 3):
            for i in range(1, 6):
                parts[f"body.{b}.rdb{d}.conv{i}"] = conv(gc if i < 5 else nf, nf + (i - 1) * gc)
    parts |= {"conv_body": conv(nf, nf), "conv_up1": conv(nf, nf), "conv_hr": conv(nf, nf), "conv_last": conv(3, nf)}
    if scale == 4:
        parts["conv_up2"] = conv(nf, nf)
    return {f"{name}.{k}": v for name, p in parts.items() for k, v in p.items()}


def srvgg_state(scale: int, nf: int = 8, convs: int = 2, zero: bool = False) -> dict:
    """Real-ESRGAN's SRVGGNetCompact (realesr-general-x4v3.pth): body.0 conv, body.1 PReLU, ..., last conv."""
    g = torch.Generator().manual_seed(7)
    state, i = {}, 0
    for cin in [3] + [nf] * convs:
        state[f"body.{i}.weight"] = torch.randn(nf, cin, 3, 3, generator=g) * 0.05
        state[f"body.{i}.bias"] = torch.zeros(nf)
        state[f"body.{i + 1}.weight"] = torch.full((nf,), 0.25)
        i += 2
    last = torch.randn(3 * scale * scale, nf, 3, 3, generator=g) * 0.05
    state[f"body.{i}.weight"] = last * 0 if zero else last
    state[f"body.{i}.bias"] = torch.zeros(3 * scale * scale)
    return state


@pytest.mark.parametrize("r", [2, 4])
def test_real_esrgan_checkpoints_drive_the_pixel_path(r, tokenizer_dir, tmp_path):
    tok = load_tokenizer(tokenizer_dir)
    low = torch.randint(0, 32, (2, 4, 4))
    torch.save({"params_ema": rrdbnet_state(4)}, tmp_path / "RealESRGAN_x4plus.pth")  # x4 also serves r = 2
    save_file(srvgg_state(r), tmp_path / f"compact_x{r}.safetensors")
    torch.save({"params": srvgg_state(4)}, tmp_path / "realesr-general-x4v3.pth")
    for name in ("RealESRGAN_x4plus.pth", f"compact_x{r}.safetensors", "realesr-general-x4v3.pth"):
        up = PixelUpsampler(tok, r, load_sr(tmp_path / name, r))
        assert up.up(low).shape == (2, 4 * r, 4 * r)
        x = torch.rand(3, 3, 10, 12) * 2 - 1
        y = up.sr(x, r)
        assert y.shape == (3, 3, 10 * r, 12 * r) and y.min() >= -1 and y.max() <= 1


def test_the_range_and_the_scale_are_converted(tmp_path):
    """A compact net whose last convolution is zero returns its input enlarged by nearest neighbours; at r = 2 a
    x4 one is that, taken down with antialiasing. A wrong [0, 1] <-> [-1, 1] conversion fails both."""
    x = torch.rand(2, 3, 8, 8) * 2 - 1
    save_file(srvgg_state(2, zero=True), tmp_path / "x2.safetensors")
    save_file(srvgg_state(4, zero=True), tmp_path / "x4.safetensors")
    nearest = lambda s: F.interpolate(x, scale_factor=s, mode="nearest")  # noqa: E731
    torch.testing.assert_close(load_sr(str(tmp_path / "x2.safetensors"), 2)(x, 2), nearest(2), atol=1e-5, rtol=0)
    want = F.interpolate(nearest(4), size=(16, 16), mode="bicubic", antialias=True, align_corners=False).clamp(-1, 1)
    torch.testing.assert_close(load_sr(str(tmp_path / "x4.safetensors"), 2)(x, 2), want, atol=1e-5, rtol=0)


def test_what_cannot_super_resolve_is_refused_in_one_line(tokenizer_dir, tmp_path):
    save_file(srvgg_state(2), tmp_path / "x2.safetensors")
    (tmp_path / "torn.pth").write_bytes(b"not a pickle")
    save_file({"some.weight": torch.zeros(3, 3)}, tmp_path / "unknown.safetensors")
    (tmp_path / "notes.txt").write_text("hello")
    cases = [("x2.safetensors", 4, "a 2x model cannot up-sample by r=4"), ("torn.pth", 2, "cannot read it"),
             ("unknown.safetensors", 2, "recognises no architecture"), ("notes.txt", 2, "not a weights file")]
    for name, r, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            load_sr(str(tmp_path / name), r)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="holds a vq_tokenizer, not an SR network"):
        load_sr(str(tokenizer_dir), 2)
    with pytest.raises(ValueError, match="not bicubic, lanczos, a weights file or an SR export"):
        load_sr("esrgan", 2)


def test_infer_checks_sr_before_loading_anything(tmp_path):
    from omegaconf import OmegaConf

    from mulosd.config import ConfigError, with_overrides
    from mulosd.config.infer import InferConfig, validate_infer

    cfg = with_overrides(OmegaConf.structured(InferConfig), {"prompt": "a red circle", "upsampler": "pixel"})
    (tmp_path / "w.pth").write_bytes(b"")
    for ok in ("bicubic", "lanczos", str(tmp_path / "w.pth")):
        validate_infer(with_overrides(cfg, {"sr": ok}))
    with pytest.raises(ConfigError, match="sr"):
        validate_infer(with_overrides(cfg, {"sr": "esrgan_x4"}))


@pytest.mark.slow
def test_pixel_sr_trains_exports_and_loads_through_spandrel(tmp_path, tmp_path_factory, tokenizer_dir):
    """`python train.py experiment=pixel_sr`: two batches, exported in upstream's key layout, and read back by
    the pixel path as any downloaded checkpoint is."""
    shards = tmp_path_factory.getbasetemp() / "sampler_shards"
    common = [c for c in _common(tokenizer_dir, shards) if not c.startswith(("model.width", "model.depth"))]
    res = _train(tmp_path, "pixel_sr", *common, "r=2", "model.width=8", "model.depth=2", "model.train.batches=2",
                 "model.train.val_every=2", "model.train.val_batches=1")
    assert "trained 2 batches (8 samples" in res.stdout
    assert list((tmp_path / "samples").glob("*.png")), "low-res | SR draft | ground truth grid"
    export = tmp_path / "export"
    sr = load_sr(str(export), 2)  # detected as Real-ESRGAN Compact from the weights alone
    assert sr.descriptor.architecture.id == "Compact" and sr.descriptor.scale == 2
    trained = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    net = sr_network(2, 8, 2)
    net.load_state_dict({k.removeprefix("sampler."): v for k, v in trained.items() if k.startswith("sampler.")})
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    torch.testing.assert_close(sr(x, 2), (net.eval()((x + 1) / 2) * 2 - 1).clamp(-1, 1), atol=2e-2, rtol=0)
    up = PixelUpsampler(load_tokenizer(tokenizer_dir), 2, sr)
    assert up.up(torch.randint(0, 32, (1, 4, 4))).shape == (1, 8, 8)


def test_pixel_sr_starts_from_an_earlier_export(tmp_path, tokenizer_dir):
    """model.init_from for the SR network: an export of experiment=pixel_sr, read through spandrel."""
    from mulosd.lit.sampler import SamplerModule

    torch.manual_seed(3)
    earlier = sr_network(2, 8, 2)
    save(earlier, "sr", tmp_path / "sr", recipe="test", config={"arch": "Compact", "r": 2, "width": 8, "depth": 2})
    module = SamplerModule(SamplerModelConfig(kind="sr", r=2, tokenizer=str(tokenizer_dir), width=8, depth=2,
                                              init_from=str(tmp_path / "sr"),
                                              loss=SamplerLossConfig(stage="mse_lpips")))
    for key, value in earlier.state_dict().items():  # fp16 in the export
        torch.testing.assert_close(module.sampler.state_dict()[key], value, atol=1e-3, rtol=1e-3)
