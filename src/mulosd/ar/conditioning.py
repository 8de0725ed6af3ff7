"""The caption-encoder interface: captions -> condition features [B, prefix, dim] for the transformer's prefix.

A frozen T5 fills it for real backbones (LlamaGen: FLAN-T5-XL, 120 slots, mulosd.llamagen.t5); SynthScenes has
a learned, structured encoder (mulosd.data.synthscenes.encoder). The transformer projects the features and owns
the learned null condition.
"""

from __future__ import annotations

from typing import Protocol

import torch


class CaptionEncoder(Protocol):
    dim: int
    prefix: int

    def __call__(self, captions: list[str]) -> torch.Tensor: ...
