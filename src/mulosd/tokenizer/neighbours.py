"""The codebook neighbour table: for each code, its k nearest codes on the L2-normalised vectors.

Pooled acceptance (MuLo-SD's B_k, LANTERN's A_{k,delta}) sums the verifier's probability over a draft
token and its nearest codes; this table is that neighbourhood, nearest first, the code itself excluded.
It depends only on the codebook, so it is computed once and cached under .cache/neighbours/, keyed by a
hash of the codebook's bytes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from .. import paths
from ..atomic import atomic_path

CACHE = paths.CACHE / "neighbours"


def neighbour_table(codebook: torch.Tensor, k: int, chunk: int = 4096) -> torch.Tensor:
    """[V, D] codebook -> [V, k] int64 indices of each code's k nearest others (cosine), nearest first."""
    v = codebook.shape[0]
    if not 1 <= k < v:
        raise ValueError(f"k must be in 1..{v - 1} for a codebook of {v} codes, got {k}")
    cb = F.normalize(codebook.float(), dim=-1)
    out = torch.empty(v, k, dtype=torch.long)
    for start in range(0, v, chunk):  # [chunk, V] similarities at a time: bounded memory for V = 16384
        sim = cb[start:start + chunk] @ cb.T
        rows = torch.arange(sim.shape[0])
        sim[rows, rows + start] = -float("inf")  # exclude the code itself
        out[start:start + chunk] = sim.topk(k, dim=1).indices
    return out


def cached_neighbour_table(codebook: torch.Tensor, k: int, cache_dir: Path = CACHE) -> torch.Tensor:
    digest = hashlib.sha256(F.normalize(codebook.detach().float().cpu(), dim=-1).numpy().tobytes()).hexdigest()[:16]
    path = Path(cache_dir) / f"{digest}_k{k}.safetensors"
    if path.is_file():
        return load_file(path)["neighbours"]
    table = neighbour_table(codebook.detach().cpu(), k)
    with atomic_path(path) as tmp:  # two processes (DDP ranks, test workers) may fill the cache at once
        save_file({"neighbours": table}, tmp)
    return table
