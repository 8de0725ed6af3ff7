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


# acceptance-map colours: what happened to each high-res token of a round's block
ROUND_COLOURS = {"accepted": (40, 200, 70), "rejected": (230, 40, 40), "expanded": (250, 200, 30),
                 "drafted": (60, 120, 250)}


def acceptance_maps(images: list[np.ndarray], rounds: list, grid: int, cell: int = 8) -> Image.Image:
    """One row per image: a tile per MuLo-SD round, then the result. A tile shows the final image, dimmed
    where the round had not reached yet, with the round's block tinted: accepted drafts green, rejected red,
    resampled by expansion only yellow (`drafted` blue marks a block with no verdict)."""
    size = grid * cell
    font = _font()
    head = 30
    sheet = Image.new("RGB", ((len(rounds) + 1) * (size + 4) + 4, head + len(images) * (size + 4)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    x = 4
    for name, rgb in ROUND_COLOURS.items():
        draw.rectangle([x, 6, x + 10, 16], fill=rgb)
        draw.text((x + 14, 4), name, fill=(20, 20, 20), font=font)
        x += 26 + 8 * len(name)
    for i, image in enumerate(images):
        base = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.NEAREST)).astype(np.float32)
        y = head + i * (size + 4)
        for k, rnd in enumerate(rounds):
            done = np.zeros(grid * grid, dtype=bool)
            for earlier in rounds[:k]:
                done |= earlier.drafted[i].numpy()
            tile = base.copy()
            labels = {"accepted": rnd.accepted[i], "rejected": rnd.rejected[i],
                      "expanded": rnd.resampled[i] & ~rnd.rejected[i]}
            colour = np.zeros((grid * grid, 3), dtype=np.float32)
            tinted = np.zeros(grid * grid, dtype=bool)
            for name, mask in labels.items():
                m = mask.numpy()
                colour[m], tinted[m] = ROUND_COLOURS[name], True
            untinted_block = rnd.drafted[i].numpy() & ~tinted
            colour[untinted_block], tinted[untinted_block] = ROUND_COLOURS["drafted"], True
            up = lambda a: np.kron(a.reshape(grid, grid, -1), np.ones((cell, cell, 1)))  # noqa: E731
            dim = up((~done & ~tinted).astype(np.float32))
            tile = tile * (1 - 0.7 * dim)
            t = up(tinted.astype(np.float32))
            tile = tile * (1 - 0.55 * t) + up(colour) * 0.55 * t
            sheet.paste(Image.fromarray(tile.clip(0, 255).astype(np.uint8)), (4 + k * (size + 4), y))
        sheet.paste(Image.fromarray(base.astype(np.uint8)), (4 + len(rounds) * (size + 4), y))
    return sheet
