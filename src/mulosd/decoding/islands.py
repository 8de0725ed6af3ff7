"""Local rejection: expansion of the rejected set, and its split into islands that resample in parallel.

N(t, l) = {u : |i_u - i_t| <= l, |j_u - j_t| <= l, u >= t0}: each rejected position drags its (2l+1)^2
neighbourhood along, but never a position before the first rejected one t0 (raster order), which stays
accepted. Islands are the 8-connected components of R_X.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

EIGHT = np.ones((3, 3), dtype=bool)


def first_rejected(rejected: torch.Tensor) -> torch.Tensor:
    """[B, H, W] bool -> raster index of the first rejected position per image (H*W where none)."""
    flat = rejected.flatten(1)
    n = flat.shape[1]
    idx = torch.where(flat, torch.arange(n, device=flat.device), n)
    return idx.min(1).values


def expand(rejected: torch.Tensor, radius: int, rejection: str = "local") -> torch.Tensor:
    """R_T [B, H, W] -> R_X. `local`: dilation by the radius, restricted to u >= t0; `raster`: every u >= t0."""
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    B, H, W = rejected.shape
    t0 = first_rejected(rejected)
    after = torch.arange(H * W, device=rejected.device)[None] >= t0[:, None]
    if rejection == "raster":
        return after.view(B, H, W)
    if rejection != "local":
        raise ValueError(f"rejection must be local or raster, got {rejection!r}")
    grown = rejected
    if radius > 0:
        grown = F.max_pool2d(rejected.float()[:, None], 2 * radius + 1, stride=1, padding=radius)[:, 0] > 0
    return grown & after.view(B, H, W)


def islands(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of a [H, W] bool mask -> (labels 1..n, 0 outside; n)."""
    labels, n = ndimage.label(mask, structure=EIGHT)
    return labels, n


def raster_linked_islands(mask: np.ndarray) -> list[np.ndarray]:
    """Islands for resampling: 8-connected components, merged where a row's last position and the next row's
    first both need resampling. The AR model predicts position u from the slot of u - 1, and the raster
    predecessor of a row start is the previous row's end: merging makes every query's predecessor either
    fixed or resampled earlier in the same island. Returns each island's raster positions, sorted."""
    labels, n = islands(mask)
    parent = list(range(n + 1))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for y in range(mask.shape[0] - 1):
        a, b = labels[y, -1], labels[y + 1, 0]
        if a and b:
            parent[find(a)] = find(b)
    flat = labels.flatten()
    groups: dict[int, list[int]] = {}
    for pos in np.flatnonzero(flat):
        groups.setdefault(find(int(flat[pos])), []).append(int(pos))
    return sorted((np.array(g) for g in groups.values()), key=lambda g: g[0])
