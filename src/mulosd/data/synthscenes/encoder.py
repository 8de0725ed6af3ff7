"""The SynthScenes caption encoder (the `CaptionEncoder` interface of mulosd.ar): learned and structured, since
slot conditioning learns far faster than free word order. The caption is parsed by the world's grammar
(unknown words are refused, naming them and the vocabulary) and each slot sums the embeddings of the words
that fill it:

    slot 0  background: colour (or 'unnamed') + texture (or 'unnamed')
    slot 1  first object: shape + colour (or 'any') + texture + count
    slot 2  second object, or 'none'
    slot 3  relation of the first object to the second, or 'none'
"""

from __future__ import annotations

import torch
from torch import nn

from . import vocab
from .caption import parse_caption
from .scene import ObjectSpec, Prompt


def _index(words) -> dict:
    return {w: i for i, w in enumerate(words)}


UNNAMED, NONE = "<unnamed>", "<none>"
BG_COLOURS = _index([UNNAMED, *vocab.BACKGROUND_COLOURS])
BG_TEXTURES = _index([UNNAMED, *vocab.BACKGROUND_TEXTURES])
SHAPES = _index([NONE, *vocab.SHAPES])
COLOURS = _index([UNNAMED, *vocab.COLOURS])
TEXTURES = _index(vocab.OBJECT_TEXTURES)
COUNTS = _index(range(vocab.MAX_OBJECTS + 1))
RELATIONS = _index([NONE, *vocab.RELATIONS])
FIELDS = {"bg_colour": BG_COLOURS, "bg_texture": BG_TEXTURES, "shape": SHAPES, "colour": COLOURS,
          "texture": TEXTURES, "count": COUNTS, "relation": RELATIONS}


def prompt_indices(prompt: Prompt) -> dict[str, list[int]]:
    """Word indices per field for the four slots (fields a slot does not use point at index 0)."""
    objs: list[ObjectSpec | None] = [*prompt.objects, None][:2]
    out = {k: [0, 0, 0, 0] for k in FIELDS}
    out["bg_colour"][0] = BG_COLOURS[prompt.background or UNNAMED]
    out["bg_texture"][0] = BG_TEXTURES[prompt.background_texture or UNNAMED]
    for slot, o in ((1, objs[0]), (2, objs[1])):
        if o is not None:
            out["shape"][slot] = SHAPES[o.shape]
            out["colour"][slot] = COLOURS[o.colour or UNNAMED]
            out["texture"][slot] = TEXTURES[o.texture]
            out["count"][slot] = COUNTS[o.count]
    out["relation"][3] = RELATIONS[prompt.relation or NONE]
    return out


class SceneCaptionEncoder(nn.Module):
    prefix = 4

    def __init__(self, dim: int = 256):
        super().__init__()
        self.dim = dim
        self.fields = nn.ModuleDict({k: nn.Embedding(len(v), dim) for k, v in FIELDS.items()})
        self.slot = nn.Parameter(torch.zeros(self.prefix, dim))
        for e in self.fields.values():
            nn.init.normal_(e.weight, std=0.02)

    def indices(self, captions: list[str]) -> dict[str, torch.Tensor]:
        """Parse captions (raises CaptionError naming unknown words) -> field indices [B, 4]."""
        rows = [prompt_indices(parse_caption(c)) for c in captions]
        device = self.slot.device
        return {k: torch.tensor([r[k] for r in rows], dtype=torch.long, device=device) for k in FIELDS}

    def forward(self, captions: list[str]) -> torch.Tensor:
        idx = self.indices(captions)
        return self.slot + sum(self.fields[k](idx[k]) for k in FIELDS)
