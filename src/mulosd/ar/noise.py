"""Randomness keyed by (seed, image, grid position, stream), not by call order.

Every random number a decoder uses is a pure function of where it is used: the Gumbel noise that picks the
token at position p of image i, or the uniform that accepts a draft there. So the same context gives the same
token whatever the decoding order or batch, and MuLo-SD with everything rejected and serial resampling
reproduces plain AR token for token.

The hash is Chris Wellons' `lowbias32` applied to a running combination of the key words, computed in int64
with every product kept below 2**63 (torch has no uint32 arithmetic; signed overflow is never relied on).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
# streams: independent noise for the different uses of one position (COUPLE_*: SJD's maximal coupling, keyed by
# position and iteration, see decoding/sjd.py; ISLAND_*: MuLo-SD's Jacobi drafts inside islands and their tests,
# apart from DRAFT, which the drafter uses at low-res positions of the same integer values)
GUMBEL, ACCEPT, DRAFT, COUPLE_TEST, COUPLE_DRAW, ISLAND_DRAFT, ISLAND_TEST = 0, 1, 2, 3, 4, 5, 6


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x < 2**32, without int64 overflow: split c into 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash32(*words: torch.Tensor | int) -> torch.Tensor:
    """A 32-bit hash of the broadcast key words (each taken mod 2**32)."""
    h, i = 0x9E3779B9, 0
    while i < len(words) and isinstance(words[i], int):  # leading Python ints (seed, stream): plain integers,
        h, i = _lowbias32((h ^ words[i]) & MASK32), i + 1  # the same values without tensor ops per call
    devices = [w.device for w in words[i:] if isinstance(w, torch.Tensor)]
    device = next((d for d in devices if d.type != "cpu"), devices[0] if devices else None)
    h = torch.tensor(h, dtype=torch.int64, device=device)
    for w in words[i:]:  # on the accelerator if any word is there: image ids often live on the host
        h = _lowbias32((h ^ (torch.as_tensor(w, dtype=torch.int64, device=device) & MASK32)) & MASK32)
    return h


def uniform(seed: int, images: torch.Tensor, positions: torch.Tensor, stream: int, size: int | None = None):
    """Float64 uniforms in (0, 1) keyed by (seed, image[b], position[b, n], stream[, k < size]) -> [B, n(, size)].
    Float64, because 1 - 2**-25 rounds to 1.0 in float32 and would make a Gumbel infinite."""
    img = images.long().view(-1, *([1] * (positions.dim() - 1)))
    pos = positions.long()
    if size is not None:
        img, pos = img.unsqueeze(-1), pos.unsqueeze(-1)
        h = hash32(seed, stream, img, pos, torch.arange(size, device=positions.device))
    else:
        h = hash32(seed, stream, img, pos)
    return ((h >> 8).double() + 0.5) / float(1 << 24)


def gumbel(seed: int, images: torch.Tensor, positions: torch.Tensor, vocab: int, stream: int = GUMBEL):
    """Gumbel(0, 1) noise [B, n, vocab] for Gumbel-max sampling at the given positions."""
    return (-torch.log(-torch.log(uniform(seed, images, positions, stream, vocab)))).float()
