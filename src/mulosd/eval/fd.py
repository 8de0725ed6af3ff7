"""FD-VGG: the Fréchet distance between two image sets in the space of ImageNet VGG16 conv5 features
(global-average-pooled, 512-d), from the offline LPIPS trunk weights. The same formula as FID on other
features: comparable across methods within this project, never to published FID numbers."""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


@functools.cache
def _vgg16_features() -> torch.nn.Module:
    import torchvision

    from ..losses.lpips_offline import ensure_trunk

    state = torch.load(ensure_trunk("vgg"), weights_only=True, map_location="cpu")
    net = torchvision.models.vgg16(weights=None).features
    net.load_state_dict({k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")})
    return net.eval().requires_grad_(False)


@torch.no_grad()
def vgg_features(images: list[np.ndarray], batch: int = 32) -> np.ndarray:
    """uint8 [H, W, 3] images -> [N, 512] float64 features (224 px, ImageNet normalisation)."""
    net, out = _vgg16_features(), []
    for i in range(0, len(images), batch):
        x = torch.stack([torch.tensor(im).permute(2, 0, 1) for im in images[i:i + batch]]).float() / 255  # copies
        x = F.interpolate(x, size=224, mode="bilinear", align_corners=False, antialias=True)
        out.append(net((x - MEAN) / STD).mean(dim=(2, 3)).double().numpy())
    return np.concatenate(out)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^1/2) for feature sets [N, D].

    Only the trace of the matrix square root is needed: it is the sum of the square roots of the eigenvalues of
    S_a S_b, which are real and >= 0 for two covariance matrices (rounding can leave tiny negative or imaginary
    parts, dropped here); no matrix square root is formed."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    trace_covmean = np.sqrt(np.clip(np.linalg.eigvals(s_a @ s_b).real, 0, None)).sum()
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a) + np.trace(s_b) - 2 * trace_covmean)
