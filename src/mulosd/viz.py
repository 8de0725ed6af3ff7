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
    """Tiles of uint8 RGB images shown `tile` px high (aspect kept, nearest-neighbour so pixels stay
    visible), each with its caption wrapped underneath."""
    if len(images) != len(captions):
        raise ValueError(f"{len(images)} images but {len(captions)} captions")
    if not images:
        raise ValueError("no images to draw")
    font = _font()
    line_h = 14
    widths = [round(tile * img.shape[1] / img.shape[0]) for img in images]
    cell_w = max(widths)
    chars = max(12, cell_w // 7)
    rows = (len(images) + cols - 1) // cols
    cell_h = tile + lines * line_h + 8
    sheet = Image.new("RGB", (cols * (cell_w + 8) + 8, rows * cell_h + 8), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    for i, (img, cap, w) in enumerate(zip(images, captions, widths, strict=True)):
        r, c = divmod(i, cols)
        x, y = 8 + c * (cell_w + 8), 8 + r * cell_h
        sheet.paste(Image.fromarray(img).resize((w, tile), Image.Resampling.NEAREST), (x, y))
        wrapped = textwrap.wrap(cap, chars)[:lines]
        for j, line in enumerate(wrapped):
            draw.text((x, y + tile + 3 + j * line_h), line, fill=(20, 20, 20), font=font)
    return sheet
