"""PatchGAN discriminator and the adversarial loss terms, as in taming-transformers' VQGAN recipe."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class NLayerDiscriminator(nn.Module):
    """PatchGAN (pix2pix): strided 4x4 convs -> one logit per overlapping patch."""

    def __init__(self, in_ch: int = 3, ndf: int = 64, n_layers: int = 3):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_ch, ndf, 4, stride=2, padding=1), nn.LeakyReLU(0.2, True)]
        mult = 1
        for n in range(1, n_layers + 1):
            prev, mult = mult, min(2**n, 8)
            stride = 2 if n < n_layers else 1
            layers += [nn.Conv2d(ndf * prev, ndf * mult, 4, stride=stride, padding=1, bias=False),
                       nn.BatchNorm2d(ndf * mult), nn.LeakyReLU(0.2, True)]
        layers.append(nn.Conv2d(ndf * mult, 1, 4, stride=1, padding=1))
        self.net = nn.Sequential(*layers)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, 0.0, 0.02)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


def hinge_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


def nonsaturating_d_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.softplus(-logits_real).mean() + F.softplus(logits_fake).mean())


def hinge_g_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    return -logits_fake.mean()


def nonsaturating_g_loss(logits_fake: torch.Tensor) -> torch.Tensor:
    return F.softplus(-logits_fake).mean()


def adaptive_weight(rec_loss: torch.Tensor, g_loss: torch.Tensor, last_layer: torch.Tensor,
                    max_weight: float = 1e4) -> torch.Tensor:
    """||grad rec|| / ||grad g|| at the decoder's last layer, clamped to [0, max_weight] (taming's VQGAN):
    the GAN term is scaled to push on the output as hard as the reconstruction terms do."""
    rec_grad = torch.autograd.grad(rec_loss, last_layer, retain_graph=True)[0]
    g_grad = torch.autograd.grad(g_loss, last_layer, retain_graph=True)[0]
    return (rec_grad.norm() / (g_grad.norm() + 1e-4)).clamp(0.0, max_weight).detach()


def warmup_factor(batches_seen: int, start: int) -> float:
    """1 once `start` batches have been trained on, else 0. Counted in batches: Lightning's global_step
    counts optimizer steps, two per batch when G and D alternate."""
    return 1.0 if batches_seen >= start else 0.0
