"""The GPU path without a GPU: every strategy decodes with its models on a virtual second device (no host tensor
meets a device tensor, tests/virtual_device.py) and in bf16 beside an fp32 caption encoder, as infer.py runs the
released backbones on CUDA. test_gpu.py runs the same decodes on a real GPU where one is present."""

import pytest
import torch

from mulosd.ar import ARBackbone, Transformer, TransformerConfig
from mulosd.data.synthscenes.encoder import SceneCaptionEncoder
from mulosd.decoding import MuLoSDConfig, PJDConfig, SDConfig, SJDConfig
from mulosd.decoding.ar import decode_ar
from mulosd.decoding.mulosd import decode_mulosd
from mulosd.decoding.pjd import decode_pjd
from mulosd.decoding.sd import decode_sd
from mulosd.decoding.sjd import decode_sjd
from mulosd.decoding.zipar import decode_zipar
from mulosd.samplers import LatentDownsampler, LatentUpsampler, PixelUpsampler
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.tokenizer.neighbours import neighbour_table

from .virtual_device import DeviceMix, VirtualDevice

CAPS = ["a red circle", "two blue squares"]
V = 64


def tiny_model(grid: int, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(vocab_size=V, grid=grid, dim=64, layers=2, heads=4, cond_dim=16)).eval()


def decodes(dtype: torch.dtype, device: str = "cpu"):
    """(name, models to place, a thunk decoding CAPS) for every strategy and its structural options; the AR
    models in `dtype`, everything on `device` (test_gpu.py: cuda)."""
    verifier, small, drafter = (tiny_model(g, seed).to(device, dtype) for g, seed in ((8, 0), (8, 1), (4, 2)))
    enc = SceneCaptionEncoder(16).eval().to(device)  # fp32, as the caption encoders stay
    codebook = torch.nn.functional.normalize(torch.randn(V, 8, generator=torch.Generator().manual_seed(3)), dim=-1)
    up, down = (S(codebook, 2, 16, 1).eval().to(device) for S in (LatentUpsampler, LatentDownsampler))
    neighbours = neighbour_table(codebook, 4).to(device)
    torch.manual_seed(4)
    tokenizer = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=V)).eval().to(device)  # the pixel path's
    models = (verifier, small, drafter, enc, up, down, neighbours, tokenizer)
    bb = lambda m: ARBackbone(m, enc, 3.0)  # noqa: E731
    ids = torch.tensor([5, 9])  # image ids come from the host, as the pipeline passes them
    mulosd = {"default": MuLoSDConfig(tau=0.3, pool_k=4),
              "the paper's expansion": MuLoSDConfig(tau=0.3, pool_k=4, expanded="resample", radius=1, draft_rows=2),
              "jacobi windows in islands, reverify": MuLoSDConfig(tau=0.3, pool_k=4, expanded="reverify",
                                                                  resample_jacobi=3),
              "parallel islands, threshold": MuLoSDConfig(tau=0.3, pool_k=4, resample="parallel",
                                                          acceptance="threshold"),
              "serial islands, raster": MuLoSDConfig(tau=0.3, pool_k=4, resample="serial", rejection="raster",
                                                     draft="serial")}
    yield "ar", models, lambda: decode_ar(bb(verifier), CAPS, image_ids=ids)
    yield "zipar", models, lambda: decode_zipar(bb(verifier), CAPS, window=2, image_ids=ids)
    for acceptance in SDConfig.ACCEPTANCES:
        yield f"sd {acceptance}", models, lambda a=acceptance: decode_sd(
            bb(verifier), bb(small), CAPS, SDConfig(gamma=3, acceptance=a, pool_k=4), image_ids=ids,
            neighbours=neighbours)
    for coupling in SJDConfig.COUPLINGS:
        yield f"sjd {coupling}", models, lambda c=coupling: decode_sjd(bb(verifier), CAPS,
                                                                       SJDConfig(window=4, coupling=c), image_ids=ids)
    yield "pjd", models, lambda: decode_pjd(bb(verifier), CAPS, PJDConfig(window=3, start=2), image_ids=ids)
    for name, knobs in mulosd.items():
        yield f"mulosd {name}", models, lambda k=knobs: decode_mulosd(
            bb(verifier), bb(drafter), up.up, down.down, CAPS, neighbours, k, image_ids=ids)
    for sr in ("bicubic", "lanczos"):
        yield f"mulosd pixel {sr}", models, lambda s=sr: decode_mulosd(
            bb(verifier), bb(drafter), PixelUpsampler(tokenizer, 2, s).up, down.down, CAPS, neighbours,
            mulosd["default"], image_ids=ids)


CASES = [name for name, _, _ in decodes(torch.float32)]


@pytest.mark.parametrize("case", CASES)
def test_every_strategy_keeps_its_tensors_on_the_models_device(case):
    name, models, run = next(c for c in decodes(torch.float32) if c[0] == case)
    with VirtualDevice() as device:
        device.place(*models)
        tokens, _ = run()
        assert device.is_on(tokens), "the tokens come back on the models' device"
    assert tokens.shape == (2, 8, 8) and 0 <= int(tokens.min()) <= int(tokens.max()) < V


@pytest.mark.parametrize("case", CASES)
def test_every_strategy_decodes_a_bf16_model_beside_an_fp32_encoder(case):
    _, _, run = next(c for c in decodes(torch.bfloat16) if c[0] == case)
    tokens, _ = run()
    assert tokens.shape == (2, 8, 8) and tokens.dtype == torch.long


def test_the_virtual_device_catches_a_host_tensor_meeting_a_device_one():
    """The check itself can fail: host image ids hashed with device positions, as the first GPU run did."""
    from mulosd.ar.noise import _lowbias32

    with VirtualDevice() as device:
        positions = torch.arange(8, device=torch.device("cpu"))[None].expand(2, -1)
        assert device.is_on(positions)
        torch.arange(8) + torch.tensor(1)  # host with a host scalar: fine
        positions + torch.tensor(1)  # a 0-dim host tensor in a device op: fine on CUDA too
        with pytest.raises(DeviceMix):
            _lowbias32(torch.arange(2)[:, None] ^ positions)
        with pytest.raises(DeviceMix):
            torch.arange(16).view(2, 8)[positions > 3]
        with pytest.raises(DeviceMix):  # .numpy() of a CUDA tensor fails without .cpu()
            positions.numpy()
        positions.cpu().numpy()
        with pytest.raises(DeviceMix):  # index_put_ moves 0-dim values only
            positions.clone()[0, torch.tensor([1, 2])] = torch.tensor([7, 7])
        row = positions.clone()
        row[0, torch.tensor([1, 2])] = torch.tensor(7)
        row[0, 1:3] = torch.tensor([7, 7])  # a copy into a slice: fine
