"""Real-world metrics, used when their packages and weights are present: FID (torchmetrics over
torch-fidelity's Inception), CLIP score (open_clip) and HPSv2. None of their weights can be fetched here, so
each metric first says whether it can run; a missing one is skipped with one line naming what is missing.

    scores, skipped = real_metrics(["fid", "clip"], images, prompts, reference_images, weights={...})
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

METRICS = ("fid", "clip", "hpsv2")


def _missing_package(name: str) -> str | None:
    return None if importlib.util.find_spec(name) else f"the package {name!r} is not installed"


def missing(metric: str, weights: dict) -> str | None:
    """Why `metric` cannot run here, or None. `weights` maps a metric to a local weights file."""
    if metric == "fid":
        for pkg in ("torchmetrics", "torch_fidelity"):
            if why := _missing_package(pkg):
                return why
        path = weights.get("fid")
        if not path or not Path(path).is_file():
            return "no Inception weights file (set metrics_weights.fid to torch-fidelity's pt_inception .pth)"
        return None
    if metric == "clip":
        if why := _missing_package("open_clip"):
            return why
        path = weights.get("clip")
        return None if path and Path(path).is_file() else "no open_clip ViT-B-32 weights file (metrics_weights.clip)"
    if metric == "hpsv2":
        if why := _missing_package("hpsv2"):
            return why
        path = weights.get("hpsv2")
        return None if path and Path(path).is_file() else "no HPSv2 checkpoint file (metrics_weights.hpsv2)"
    raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")


def _uint8_batch(images: list[np.ndarray]) -> torch.Tensor:
    return torch.stack([torch.from_numpy(np.ascontiguousarray(im)).permute(2, 0, 1) for im in images])


def fid(images, reference, weights_file: str) -> float:
    from torchmetrics.image.fid import FrechetInceptionDistance

    metric = FrechetInceptionDistance(feature=2048, feature_extractor_weights_path=weights_file)
    metric.update(_uint8_batch(reference), real=True)
    metric.update(_uint8_batch(images), real=False)
    return float(metric.compute())


def clip_score(images, prompts, weights_file: str) -> float:
    import open_clip

    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-32", pretrained=weights_file)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    from PIL import Image

    with torch.no_grad():
        x = torch.stack([preprocess(Image.fromarray(im)) for im in images])
        img = torch.nn.functional.normalize(model.encode_image(x), dim=-1)
        txt = torch.nn.functional.normalize(model.encode_text(tokenizer(prompts)), dim=-1)
    return float(100 * (img * txt).sum(-1).clamp_min(0).mean())


def hpsv2_score(images, prompts, weights_file: str) -> float:
    import hpsv2
    from PIL import Image

    scores = [hpsv2.score(Image.fromarray(im), p, cp=weights_file)[0] for im, p in zip(images, prompts, strict=True)]
    return float(np.mean(scores))


def real_metrics(names, images, prompts, reference, weights: dict | None = None) -> tuple[dict, dict]:
    """-> ({metric: value}, {metric: why it was skipped})."""
    weights = weights or {}
    scores, skipped = {}, {}
    for name in names:
        why = missing(name, weights)
        if why:
            skipped[name] = why
            continue
        if name == "fid":
            scores[name] = fid(images, reference, weights["fid"])
        elif name == "clip":
            scores[name] = clip_score(images, prompts, weights["clip"])
        else:
            scores[name] = hpsv2_score(images, prompts, weights["hpsv2"])
    return scores, skipped
