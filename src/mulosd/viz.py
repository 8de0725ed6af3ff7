"""Pictures people look at: captioned image grids."""

from __future__ import annotations

import textwrap

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def _font(size: int = 12):
    try:
        return ImageFont.load_default(size=size)  # Pillow's bundled scalable font
    except (TypeError, OSError):
        return ImageFont.load_default()


def captioned_grid(images: list[np.ndarray], captions: list[str], cols: int = 4, tile: int = 192,
                   lines: int = 4) -> Image.Image:
    """Tiles of uint8 RGB images (any sizes, shown at `tile` px, nearest-neighbour so pixels stay visible),
    each with its caption wrapped underneath."""
    if len(images) != len(captions):
        raise ValueError(f"{len(images)} images but {len(captions)} captions")
    font = _font()
    line_h = 14
    chars = max(12, tile // 7)
    rows = (len(images) + cols - 1) // cols
    cell_h = tile + lines * line_h + 8
    sheet = Image.new("RGB", (cols * (tile + 8) + 8, rows * cell_h + 8), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (img, cap) in enumerate(zip(images, captions, strict=True)):
        r, c = divmod(i, cols)
        x, y = 8 + c * (tile + 8), 8 + r * cell_h
        sheet.paste(Image.fromarray(img).resize((tile, tile), Image.Resampling.NEAREST), (x, y))
        wrapped = textwrap.wrap(cap, chars)[:lines]
        for j, line in enumerate(wrapped):
            draw.text((x, y + tile + 3 + j * line_h), line, fill=(20, 20, 20), font=font)
    return sheet
