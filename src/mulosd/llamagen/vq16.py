"""LlamaGen's VQ tokenizer (`tokenizer/tokenizer_image/vq_model.py`, VQ_16) behind this project's
`VQTokenizer` interface: the module tree carries upstream's names, so `vq_ds16_t2i.pt` loads as it is.

Structure: conv_in -> per level `num_res_blocks` ResnetBlocks (+ self-attention at the lowest resolution)
and a stride-2 conv (padded right and bottom) -> mid (res, attn, res) -> GroupNorm(32) + swish -> conv_out;
the decoder mirrors it with `num_res_blocks + 1` blocks per level and nearest x2 + conv. Codes are
L2-normalised at use (`codebook_l2_norm`), as in our own tokenizer, so encode/decode/codebook are shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..tokenizer.vq import VectorQuantizer, VQConfig, VQModel


@dataclass
class VQ16Config(VQConfig):
    """Our VQConfig's fields with VQ_16's sizes (downsample 16, 16384 codes of 8)."""

    ch: int = 128
    ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 2
    z_channels: int = 256
    codebook_size: int = 16384


def _norm(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, ch, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all positions, 1x1 convolutions for q, k, v and the output."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm = _norm(ch)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x):
        h = self.norm(x)
        B, C, H, W = x.shape
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # [B, HW, C]
        y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(y.transpose(1, 2).reshape(B, C, H, W))


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _level(cin: int, cout: int, blocks: int, attn: bool) -> tuple[nn.Module, int]:
    level = nn.Module()
    level.res = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout) for i in range(blocks))
    level.attn = nn.ModuleList(AttnBlock(cout) for _ in range(blocks)) if attn else nn.ModuleList()
    return level, cout


def _run_level(level: nn.Module, h: torch.Tensor) -> torch.Tensor:
    for i, res in enumerate(level.res):
        h = res(h)
        if len(level.attn):
            h = level.attn[i](h)
    return h


def _mid(ch: int) -> nn.ModuleList:
    return nn.ModuleList([ResnetBlock(ch, ch), AttnBlock(ch), ResnetBlock(ch, ch)])


class Encoder(nn.Module):
    def __init__(self, c: VQ16Config):
        super().__init__()
        self.conv_in = nn.Conv2d(3, c.ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        ch, last = c.ch, len(c.ch_mult) - 1
        for i, m in enumerate(c.ch_mult):
            level, ch = _level(ch, c.ch * m, c.num_res_blocks, attn=i == last)
            if i != last:
                level.downsample = Downsample(ch)
            self.conv_blocks.append(level)
        self.mid = _mid(ch)
        self.norm_out, self.conv_out = _norm(ch), nn.Conv2d(ch, c.z_channels, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = _run_level(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, c: VQ16Config):
        super().__init__()
        ch = c.ch * c.ch_mult[-1]
        self.conv_in = nn.Conv2d(c.z_channels, ch, 3, padding=1)
        self.mid = _mid(ch)
        self.conv_blocks = nn.ModuleList()
        last = len(c.ch_mult) - 1
        for i in reversed(range(len(c.ch_mult))):
            level, ch = _level(ch, c.ch * c.ch_mult[i], c.num_res_blocks + 1, attn=i == last)
            if i != 0:
                level.upsample = Upsample(ch)
            self.conv_blocks.append(level)
        self.norm_out, self.conv_out = _norm(ch), nn.Conv2d(ch, 3, 3, padding=1)

    def forward(self, z):
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = _run_level(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class LlamaGenVQ(VQModel):
    """VQ_16 (or any ch_mult) with upstream's parameter names; the VQTokenizer methods are VQModel's."""

    def __init__(self, config: VQ16Config):
        nn.Module.__init__(self)
        self.config = config
        self.encoder, self.decoder = Encoder(config), Decoder(config)
        self.quantize = VectorQuantizer(config.codebook_size, config.code_dim, config.beta)
        self.quant_conv = nn.Conv2d(config.z_channels, config.code_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.code_dim, config.z_channels, 1)


VQ_IGNORED = ("quantize.codebook_used",)  # upstream's usage statistics buffer


def config_from_state(state: dict[str, torch.Tensor]) -> VQ16Config:
    """The VQ16Config a state dict was saved from, read off its shapes (channels, levels, blocks, codebook)."""
    try:
        ch = state["encoder.conv_in.weight"].shape[0]
        levels = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.conv_blocks."))
        ch_mult = [state[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in range(levels)]
        blocks = 1 + max(int(k.split(".")[4]) for k in state if k.startswith("encoder.conv_blocks.0.res."))
        size, dim = state["quantize.embedding.weight"].shape
        return VQ16Config(ch=ch, ch_mult=ch_mult, num_res_blocks=blocks, codebook_size=size, code_dim=dim,
                          z_channels=state["quant_conv.weight"].shape[1])
    except (KeyError, ValueError) as e:
        raise ValueError(f"not a LlamaGen VQ state dict (no {e})") from None


def load_vq_state(model: LlamaGenVQ, state: dict[str, torch.Tensor]) -> None:
    """Load an upstream VQ state dict, naming the first missing, extra or misshapen key."""
    state = {k.removeprefix("module."): v for k, v in state.items() if k not in VQ_IGNORED}
    own = model.state_dict()
    for key, value in own.items():
        if key not in state:
            raise ValueError(f"LlamaGen VQ checkpoint lacks {key!r}")
        if state[key].shape != value.shape:
            raise ValueError(f"LlamaGen VQ checkpoint: {key!r} has shape {tuple(state[key].shape)}, expected "
                             f"{tuple(value.shape)} for {model.config}")
    extra = sorted(set(state) - set(own))
    if extra:
        raise ValueError(f"LlamaGen VQ checkpoint has keys this architecture does not: {extra[:5]}")
    model.load_state_dict(state)
