"""Learned super-resolution for the pixel path (`upsampler=pixel sr=...`): any checkpoint spandrel recognises
(Real-ESRGAN, SwinIR, HAT and the rest of the field's SR families), and the network this framework trains
(`experiment=pixel_sr`): Real-ESRGAN's compact SRVGG, built from spandrel's class so that its exports keep
upstream's key layout and load through the same detection path as a downloaded checkpoint.

zoo.load_sr resolves `sr=` (a file, or an export by name) to the LearnedSR below. Spandrel's models take and
give images in [0, 1]; the pixel path works in [-1, 1]. A model of a larger scale
than r (Real-ESRGAN's x4 at r = 2) runs at its own scale and is then resized down to r with antialiasing, as
Real-ESRGAN's own `outscale` does; a smaller scale is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

WEIGHT_SUFFIXES = (".pth", ".pt", ".ckpt", ".safetensors")  # the files spandrel reads


def sr_network(r: int, width: int, depth: int) -> nn.Module:
    """The SR network the framework trains: SRVGGNetCompact with `depth` 3x3 convolutions of `width`
    channels at the low resolution, a pixel shuffle to r x, and the nearest-neighbour image added."""
    from spandrel.architectures.Compact import Compact

    return Compact(num_in_ch=3, num_out_ch=3, num_feat=width, num_conv=depth, upscale=r, act_type="prelu")


def last_layer(net: nn.Module) -> torch.Tensor:
    """The weight the adaptive GAN weight balances at (the convolution before the pixel shuffle)."""
    return net.body[-1].weight


def forward_pm1(net: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """A spandrel-convention network on [-1, 1] images (differentiable: training uses it)."""
    return net((images + 1) / 2) * 2 - 1


class LearnedSR:
    """A spandrel model descriptor as the pixel path's SuperResolver `(images [B,3,H,W] in [-1,1], r)`."""

    def __init__(self, descriptor, r: int, name: str):
        from spandrel import ImageModelDescriptor

        if not isinstance(descriptor, ImageModelDescriptor) or descriptor.purpose not in ("SR", "Restoration"):
            raise ValueError(f"sr={name}: spandrel reads it as a {getattr(descriptor, 'purpose', '?')} model, "
                             "not super-resolution")
        if descriptor.input_channels != 3 or descriptor.output_channels != 3:
            raise ValueError(f"sr={name}: a {descriptor.input_channels}->{descriptor.output_channels} channel model; "
                             "the pixel path needs RGB -> RGB")
        if descriptor.scale < r:
            raise ValueError(f"sr={name}: a {descriptor.scale}x model cannot up-sample by r={r}")
        self.descriptor, self.r, self.name = descriptor.eval(), r, name

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, r: int) -> torch.Tensor:
        if r != self.r:
            raise ValueError(f"sr={self.name} was loaded for r={self.r}, called with r={r}")
        d = self.descriptor
        x = ((images + 1) / 2).to(device=d.device, dtype=d.dtype)
        out = d(x).float()
        size = (images.shape[-2] * r, images.shape[-1] * r)
        if out.shape[-2:] != size:  # a larger scale than r, taken down to r
            out = F.interpolate(out, size=size, mode="bicubic", antialias=True, align_corners=False)
        return (out * 2 - 1).clamp(-1, 1).to(images.device)


def sr_from_file(path: str | Path, r: int, device: str | torch.device = "cpu") -> LearnedSR:
    """A weights file spandrel reads (.pth, .pt, .ckpt, .safetensors)."""
    path = Path(path)
    if path.suffix.lower() not in WEIGHT_SUFFIXES:
        raise ValueError(f"sr={path}: not a weights file ({', '.join(WEIGHT_SUFFIXES)})")
    from spandrel import ModelLoader

    try:
        state = ModelLoader(device).load_state_dict_from_file(path)
    except Exception as e:  # truncated, not a state dict, or a pickle spandrel's unpickler refuses
        raise ValueError(f"sr={path}: cannot read it: {str(e).splitlines()[0]}") from None
    return sr_from_state(state, r, str(path), device)


def sr_from_state(state: dict, r: int, name: str, device: str | torch.device = "cpu") -> LearnedSR:
    """Weights whose architecture spandrel detects from their keys and shapes."""
    from spandrel import ModelLoader, UnsupportedModelError

    try:
        descriptor = ModelLoader(device).load_from_state_dict(state)
    except UnsupportedModelError:
        raise ValueError(f"sr={name}: spandrel recognises no architecture in these weights") from None
    except RuntimeError as e:  # an architecture recognised by its keys whose tensors do not fit it
        raise ValueError(f"sr={name}: the weights do not fit the architecture spandrel detects "
                         f"({' '.join(str(e).split())[:160]})") from None
    return LearnedSR(descriptor, r, name)
