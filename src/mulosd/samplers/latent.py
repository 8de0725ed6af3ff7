"""Latent up-sampler U_r and down-sampler D_r between a drafter's and a verifier's token grids.

Both read tokens through the tokenizer's frozen, normalised codebook and are **row-causal**: MuLo-SD drafts
low-res rows one block at a time, so the high-res rows r*j .. r*j+r-1 that U_r emits for low-res row j may
depend on low-res rows <= j only, and the low-res row j that D_r returns may depend on committed high-res
rows < r*(j+1) only. Causality comes from convolutions padded only above (a 3x3 kernel sees the row itself
and the rows above it, all columns) and from normalising over channels alone: GroupNorm or BatchNorm would
pool statistics over later rows and leak the future.

Heads: `logits` (stage 1, token CE) or `latent`, a continuous code vector on the unit sphere quantised to
the nearest code with a straight-through estimator (stages 2 and 3: decoded by the frozen VQ decoder).

`base=bicubic` makes U_r a learned correction of the pixel path, as SR networks learn a residual over an
interpolated image: the frozen tokenizer decodes the low-res tokens, bicubic interpolation takes the image to the
high resolution and the encoder's latents there become the base (the logits head adds their cosine with every
code, the latent head adds the latents themselves), fed to the network too. Its last layer starts at zero, so an
untrained U_r returns exactly the pixel path's tokens and training can only start from interpolation. The base is
not row-causal (the VQ decoder and encoder see several rows), which costs nothing in MuLo-SD: it up-samples the
whole known low-res prefix and keeps only the new rows, as for the pixel path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..choices import UPSAMPLER_BASES
from .pixel import bicubic

HEADS = ("logits", "latent")


class RowCausalConv(nn.Conv2d):
    """k x k convolution whose output row i sees input rows i-k+1 .. i (zero-padded above), all columns."""

    def __init__(self, cin: int, cout: int, k: int = 3):
        super().__init__(cin, cout, k, padding=0)
        self.k = k

    def forward(self, x):
        k = self.k
        return super().forward(F.pad(x, (k // 2, k // 2, k - 1, 0)))


class ChannelNorm(nn.Module):
    """LayerNorm over channels at each position: no statistics cross rows."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm = nn.LayerNorm(ch)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class CausalResBlock(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.block = nn.Sequential(ChannelNorm(ch), nn.GELU(), RowCausalConv(ch, ch), ChannelNorm(ch), nn.GELU(),
                                   RowCausalConv(ch, ch))

    def forward(self, x):
        return x + self.block(x)


class CodeEmbedding(nn.Module):
    """Token ids -> the tokenizer's normalised code vectors (frozen buffer) -> width channels."""

    def __init__(self, codebook: torch.Tensor, width: int):
        super().__init__()
        self.register_buffer("codebook", F.normalize(codebook.detach().float(), dim=-1).clone())
        self.proj = nn.Conv2d(codebook.shape[1], width, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.codebook[tokens].permute(0, 3, 1, 2))


def nearest_code(z: torch.Tensor, codebook: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """z [B,D,h,w] -> (straight-through quantised z on the unit sphere, token ids [B,h,w])."""
    zn = F.normalize(z, dim=1)
    idx = torch.einsum("bdhw,vd->bvhw", zn, codebook.to(zn.dtype)).argmax(1)
    q = codebook[idx].permute(0, 3, 1, 2).to(zn.dtype)
    return zn + (q - zn).detach(), idx


class LatentUpsampler(nn.Module):
    """U_r: low-res tokens [B,h,w] -> high-res logits [B,V,rh,rw] or latents [B,D,rh,rw]."""

    def __init__(self, codebook: torch.Tensor, r: int, width: int = 128, depth: int = 4, head: str = "logits",
                 base: str = "none"):
        super().__init__()
        if r not in (2, 4):
            raise ValueError(f"r must be 2 or 4, got {r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        if base not in UPSAMPLER_BASES:
            raise ValueError(f"base must be one of {UPSAMPLER_BASES}, got {base!r}")
        self.r, self.width, self.depth, self.head_kind, self.base = r, width, depth, head, base
        self.embed = CodeEmbedding(codebook, width)
        self.trunk = nn.Sequential(*[CausalResBlock(width) for _ in range(depth)])
        self.expand = nn.Conv2d(width, r * r * width, 1)  # per position: channel expansion, then PixelShuffle
        self.shuffle = nn.PixelShuffle(r)
        # after the shuffle a row may look up (its own block or earlier ones), never down into the next block
        self.refine = nn.Sequential(ChannelNorm(width), nn.GELU(), RowCausalConv(width, width), ChannelNorm(width),
                                    nn.GELU())
        out = codebook.shape[0] if head == "logits" else codebook.shape[1]
        self.head = nn.Conv2d(width, out, 1)
        object.__setattr__(self, "tokenizer", None)  # the base's frozen tokenizer: not a submodule, not exported
        if base != "none":
            self.base_proj = nn.Conv2d(codebook.shape[1], width, 1)
            nn.init.zeros_(self.head.weight)  # untrained, U_r returns the base's tokens
            nn.init.zeros_(self.head.bias)
            if head == "logits":  # the base's cosines, sharpened to logits by a learned temperature
                self.base_log_scale = nn.Parameter(torch.tensor(math.log(10.0)))

    @property
    def codebook(self) -> torch.Tensor:
        return self.embed.codebook

    def to_config(self) -> dict:
        """What an export's config.json records; `build_sampler` rebuilds the architecture from it."""
        V, D = self.codebook.shape
        return {"kind": "up", "r": self.r, "width": self.width, "depth": self.depth, "head": self.head_kind,
                "base": self.base, "codebook_size": V, "code_dim": D}

    def use_tokenizer(self, tokenizer: nn.Module) -> LatentUpsampler:
        """The frozen tokenizer a base is computed with (the one whose codes U_r reads and writes)."""
        object.__setattr__(self, "tokenizer", tokenizer)
        return self

    @torch.no_grad()
    def interpolated(self, tokens_low: torch.Tensor) -> torch.Tensor:
        """The base: the pixel path's high-res latents [B,D,rh,rw] on the unit sphere (decode, bicubic, encode)."""
        if self.tokenizer is None:
            raise ValueError(f"this U_r corrects {self.base} interpolation and needs its tokenizer: "
                             "load_sampler(..., tokenizer=...) or use_tokenizer()")
        images = self.tokenizer.decode(tokens_low).clamp(-1, 1)
        return F.normalize(self.tokenizer.encode_latents(bicubic(images, self.r)), dim=1)

    def last_layer(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, tokens_low: torch.Tensor) -> torch.Tensor:
        x = self.shuffle(self.expand(self.trunk(self.embed(tokens_low))))
        if self.base == "none":
            return self.head(self.refine(x))
        z = self.interpolated(tokens_low)
        out = self.head(self.refine(x + self.base_proj(z)))
        if self.head_kind == "latent":
            return out + z
        codes = self.tokenizer.codebook().to(z.dtype)  # the tokenizer's own, so the base's argmax is its encode
        return out + self.base_log_scale.exp() * torch.einsum("bdhw,vd->bvhw", z, codes)

    def quantised(self, tokens_low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent head only: (straight-through quantised latents [B,D,rh,rw], tokens [B,rh,rw])."""
        if self.head_kind != "latent":
            raise ValueError("quantised() needs the latent head")
        return nearest_code(self(tokens_low), self.codebook)

    @torch.no_grad()
    def up(self, tokens_low: torch.Tensor) -> torch.Tensor:
        """low-res tokens [B,h,w] -> high-res tokens [B,rh,rw]."""
        if self.head_kind == "logits":
            return self(tokens_low).argmax(1)
        return self.quantised(tokens_low)[1]


class LatentDownsampler(nn.Module):
    """D_r: high-res tokens [B,rh,rw] -> low-res logits [B,V,h,w]. PixelUnshuffle first, so each low-res row
    sees exactly its own r high-res rows, then row-causal convolutions at low resolution."""

    def __init__(self, codebook: torch.Tensor, r: int, width: int = 128, depth: int = 4):
        super().__init__()
        if r not in (2, 4):
            raise ValueError(f"r must be 2 or 4, got {r}")
        self.r, self.width, self.depth = r, width, depth
        self.embed = CodeEmbedding(codebook, width // 4)
        self.unshuffle = nn.PixelUnshuffle(r)
        self.proj = nn.Conv2d(r * r * (width // 4), width, 1)
        self.trunk = nn.Sequential(*[CausalResBlock(width) for _ in range(depth)])
        self.head = nn.Sequential(ChannelNorm(width), nn.GELU(), nn.Conv2d(width, codebook.shape[0], 1))

    @property
    def codebook(self) -> torch.Tensor:
        return self.embed.codebook

    def to_config(self) -> dict:
        V, D = self.codebook.shape
        return {"kind": "down", "r": self.r, "width": self.width, "depth": self.depth, "codebook_size": V,
                "code_dim": D}

    def forward(self, tokens_high: torch.Tensor) -> torch.Tensor:
        if tokens_high.shape[-1] % self.r or tokens_high.shape[-2] % self.r:
            raise ValueError(f"grid {tuple(tokens_high.shape[-2:])} is not a multiple of r={self.r}")
        return self.head(self.trunk(self.proj(self.unshuffle(self.embed(tokens_high)))))

    @torch.no_grad()
    def down(self, tokens_high: torch.Tensor) -> torch.Tensor:
        return self(tokens_high).argmax(1)


def head_for(stage: str) -> str:
    """The up-sampler head a training stage needs: logits for token CE, quantised latents for the pixel losses."""
    return "logits" if stage == "token_ce" else "latent"


def build_sampler(config: dict, codebook: torch.Tensor) -> nn.Module:
    """The sampler a `to_config()` dict describes (an export's config.json), around a codebook [V, D]. Exports
    written before samplers recorded their head name the training stage instead."""
    c = config
    if c["kind"] == "down":
        return LatentDownsampler(codebook, c["r"], c["width"], c["depth"])
    return LatentUpsampler(codebook, c["r"], c["width"], c["depth"], head=c.get("head") or head_for(c["stage"]),
                           base=c.get("base", "none"))
