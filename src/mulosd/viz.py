"""Pictures people look at: captioned image grids."""

from __future__ import annotations

import textwrap

import numpy as np
import torch
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


def _upscale(a: np.ndarray, grid: int, cell: int) -> np.ndarray:
    """Per-token values [grid*grid, C] -> per-pixel [grid*cell, grid*cell, C]."""
    return np.kron(a.reshape(grid, grid, -1), np.ones((cell, cell, 1)))


def _tint(image: np.ndarray, colour: np.ndarray, tinted: np.ndarray, dimmed: np.ndarray, grid: int,
          strength: float = 0.55) -> np.ndarray:
    """uint8 image [S, S, 3] with tokens `tinted` [N] blended towards `colour` [N, 3] and tokens `dimmed` [N]
    darkened (not reached yet)."""
    cell = image.shape[0] // grid
    out = image.astype(np.float32) * (1 - 0.7 * _upscale(dimmed.astype(np.float32), grid, cell))
    t = _upscale(tinted.astype(np.float32), grid, cell)
    out = out * (1 - strength * t) + _upscale(colour.astype(np.float32), grid, cell) * strength * t
    return out.clip(0, 255).astype(np.uint8)


def _round_colours(rnd, i: int, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """A round's per-token colours and tinted mask for image i (see ROUND_COLOURS)."""
    labels = {"accepted": rnd.accepted[i], "rejected": rnd.rejected[i],
              "expanded": rnd.resampled[i] & ~rnd.rejected[i]}
    colour = np.zeros((grid * grid, 3), dtype=np.float32)
    tinted = np.zeros(grid * grid, dtype=bool)
    for name, mask in labels.items():
        m = mask.numpy()
        colour[m], tinted[m] = ROUND_COLOURS[name], True
    untinted_block = rnd.drafted[i].numpy() & ~tinted
    colour[untinted_block], tinted[untinted_block] = ROUND_COLOURS["drafted"], True
    return colour, tinted


def _legend(draw, font, x: int = 4, names=ROUND_COLOURS) -> None:
    for name in names:
        draw.rectangle([x, 6, x + 10, 16], fill=ROUND_COLOURS[name])
        draw.text((x + 14, 4), name, fill=(20, 20, 20), font=font)
        x += 26 + 8 * len(name)


def acceptance_maps(images: list[np.ndarray], rounds: list, grid: int, cell: int = 8) -> Image.Image:
    """One row per image: a tile per MuLo-SD round, then the result. A tile shows the final image, dimmed
    where the round had not reached yet, with the round's block tinted: accepted drafts green, rejected red,
    resampled by expansion only yellow (`drafted` blue marks a block with no verdict)."""
    size = grid * cell
    head = 30
    sheet = Image.new("RGB", ((len(rounds) + 1) * (size + 4) + 4, head + len(images) * (size + 4)), (255, 255, 255))
    _legend(ImageDraw.Draw(sheet), _font())
    for i, image in enumerate(images):
        base = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.NEAREST))
        y = head + i * (size + 4)
        for k, rnd in enumerate(rounds):
            done = np.zeros(grid * grid, dtype=bool)
            for earlier in rounds[:k]:
                done |= earlier.drafted[i].numpy()
            colour, tinted = _round_colours(rnd, i, grid)
            tile = _tint(base, colour, tinted, ~done & ~tinted, grid)
            sheet.paste(Image.fromarray(tile), (4 + k * (size + 4), y))
        sheet.paste(Image.fromarray(base), (4 + len(rounds) * (size + 4), y))
    return sheet


# distinct colours for rejection islands (cycled when a round has more)
ISLAND_COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
                  (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


@torch.no_grad()
def round_panels(tokenizer, rnd, final: torch.Tensor, i: int = 0, size: int = 192) -> dict[str, np.ndarray]:
    """The steps of one MuLo-SD round for image i, as pictures `size` px wide (nearest-neighbour), rows the
    round had not reached dimmed:
    low-res draft (M_q's grid after drafting the block) | up-sampled draft (U_r) | verifier acceptance
    (accepted green, rejected red, expanded yellow) | rejection islands (one colour each, resampled
    concurrently) | committed (the block after resampling). `final` [B, G, G] is the decoded token grid:
    rows a round commits never change later."""
    from .data.stream import to_image
    from .decoding.islands import raster_linked_islands

    if rnd.low_draft is None or rnd.high_draft is None:
        raise ValueError("this round carries no drafts (only decode_mulosd records them)")
    G = final.shape[-1]
    g = int(round(rnd.low_draft.shape[1] ** 0.5))
    r = G // g
    block = rnd.drafted[i].view(G, G).any(1).nonzero().flatten()
    row1 = int(block.max()) + 1  # rows [0, row1) are committed once this round ends

    device = next(tokenizer.parameters()).device

    def picture(tokens, grid, reached_rows):
        image = to_image(tokenizer.decode(tokens.view(1, grid, grid).to(device)).clamp(-1, 1)[0])
        image = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.NEAREST))
        later = (torch.arange(grid * grid) >= reached_rows * grid).numpy()
        return _tint(image, np.zeros((grid * grid, 3)), np.zeros(grid * grid, bool), later, grid)

    low = picture(rnd.low_draft[i], g, row1 // r)
    up = picture(rnd.high_draft[i], G, row1)
    colour, tinted = _round_colours(rnd, i, G)
    verdict = _tint(up, colour, tinted, np.zeros(G * G, bool), G)
    colour, tinted = np.zeros((G * G, 3), np.float32), np.zeros(G * G, bool)
    redo = rnd.resampled[i].view(G, G).numpy()
    for j, island in enumerate(raster_linked_islands(redo)):
        colour[island], tinted[island] = ISLAND_COLOURS[j % len(ISLAND_COLOURS)], True
    isl = _tint(up, colour, tinted, np.zeros(G * G, bool), G, strength=0.75)
    committed = picture(final[i].flatten().cpu(), G, row1)
    return {"low-res draft (M_q)": low, "up-sampled draft (U_r)": up, "verifier acceptance": verdict,
            "rejection islands": isl, "committed": committed}
