"""A VQ image tokenizer in the LlamaGen style: conv encoder -> L2-normalised codebook -> conv decoder.

Codes live on the unit sphere (LlamaGen's `codebook_l2_norm`), so nearest-by-L2 equals nearest-by-cosine,
low-dimensional codes (8) stay well used, and the codebook neighbour table that pooled acceptance needs is
built on exactly the vectors the quantiser compares against.

Interface (`VQTokenizer`): encode(images[B,3,H,W] in [-1,1]) -> tokens[B,H/f,W/f];
decode(tokens) -> images; decode_latents(z[B,D,h,w]) -> images; codebook() -> [V,D] normalised; `downsample`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class VQConfig:
    ch: int = 32  # channels at full resolution
    ch_mult: list[int] = field(default_factory=lambda: [1, 2, 4, 4])  # one level per entry; f = 2**(len-1)
    num_res_blocks: int = 1
    z_channels: int = 64
    codebook_size: int = 1024
    code_dim: int = 8
    beta: float = 0.25  # commitment weight

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def _norm(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, ch // 4), ch, eps=1e-6)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.block = nn.Sequential(_norm(cin), nn.SiLU(), nn.Conv2d(cin, cout, 3, padding=1),
                                   _norm(cout), nn.SiLU(), nn.Conv2d(cout, cout, 3, padding=1))
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        return self.skip(x) + self.block(x)


class Encoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        chans = [c.ch * m for m in c.ch_mult]
        layers: list[nn.Module] = [nn.Conv2d(3, chans[0], 3, padding=1)]
        cin = chans[0]
        for level, cout in enumerate(chans):
            for _ in range(c.num_res_blocks):
                layers.append(ResBlock(cin, cout))
                cin = cout
            if level < len(chans) - 1:
                layers.append(nn.Conv2d(cin, cin, 4, stride=2, padding=1))
        layers += [ResBlock(cin, cin), _norm(cin), nn.SiLU(), nn.Conv2d(cin, c.z_channels, 3, padding=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class Decoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        chans = [c.ch * m for m in c.ch_mult][::-1]
        cin = chans[0]
        layers: list[nn.Module] = [nn.Conv2d(c.z_channels, cin, 3, padding=1), ResBlock(cin, cin)]
        for level, cout in enumerate(chans):
            for _ in range(c.num_res_blocks + 1):
                layers.append(ResBlock(cin, cout))
                cin = cout
            if level < len(chans) - 1:
                layers += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(cin, cin, 3, padding=1)]
        layers += [_norm(cin), nn.SiLU()]
        self.net = nn.Sequential(*layers)
        self.conv_out = nn.Conv2d(cin, 3, 3, padding=1)  # the "last layer" of the adaptive GAN weight

    def forward(self, z):
        return self.conv_out(self.net(z))


class VectorQuantizer(nn.Module):
    """Nearest code on the unit sphere, straight-through gradients, codebook + commitment loss."""

    def __init__(self, size: int, dim: int, beta: float):
        super().__init__()
        self.beta = beta
        self.embedding = nn.Embedding(size, dim)
        nn.init.normal_(self.embedding.weight)

    def codebook(self) -> torch.Tensor:
        return F.normalize(self.embedding.weight, dim=-1)

    def indices(self, z: torch.Tensor) -> torch.Tensor:
        """z [B,D,h,w] -> nearest code index [B,h,w] (cosine = L2 on normalised vectors)."""
        zn = F.normalize(z, dim=1)
        scores = torch.einsum("bdhw,vd->bvhw", zn, self.codebook().to(zn.dtype))
        return scores.argmax(dim=1)

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        """tokens [B,h,w] -> code vectors [B,D,h,w]."""
        return self.codebook()[idx].permute(0, 3, 1, 2)

    def forward(self, z: torch.Tensor):
        zn = F.normalize(z, dim=1)
        idx = self.indices(zn)
        q = self.lookup(idx).to(zn.dtype)
        loss = F.mse_loss(q, zn.detach()) + self.beta * F.mse_loss(zn, q.detach())
        return zn + (q - zn).detach(), idx, loss


class VQModel(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.code_dim, 1)
        self.quantize = VectorQuantizer(config.codebook_size, config.code_dim, config.beta)
        self.post_quant_conv = nn.Conv2d(config.code_dim, config.z_channels, 1)
        self.decoder = Decoder(config)

    def to_config(self) -> dict:
        """What an export's config.json records; `from_config` rebuilds the architecture from it."""
        return asdict(self.config)

    @classmethod
    def from_config(cls, config: dict) -> VQModel:
        return cls(VQConfig(**config))

    @property
    def downsample(self) -> int:
        return self.config.downsample

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    def codebook(self) -> torch.Tensor:
        return self.quantize.codebook()

    def last_layer(self) -> torch.Tensor:
        return self.decoder.conv_out.weight

    def _check(self, images: torch.Tensor) -> None:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images [B,3,H,W], got {tuple(images.shape)}")
        if images.shape[-1] % self.downsample or images.shape[-2] % self.downsample:
            raise ValueError(f"image size {tuple(images.shape[-2:])} is not a multiple of {self.downsample}")

    def encode_latents(self, images: torch.Tensor) -> torch.Tensor:
        self._check(images)
        return self.quant_conv(self.encoder(images))

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return self.quantize.indices(self.encode_latents(images))

    def decode_latents(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(z))

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.min() < 0 or tokens.max() >= self.codebook_size:
            raise ValueError(f"token ids must be in [0, {self.codebook_size}), got {tokens.min()}..{tokens.max()}")
        return self.decode_latents(self.quantize.lookup(tokens))

    def forward(self, images: torch.Tensor):
        """Reconstruction, token ids and the quantiser loss (training path)."""
        q, idx, qloss = self.quantize(self.encode_latents(images))
        return self.decode_latents(q), idx, qloss
