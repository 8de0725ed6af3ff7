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
BLANK = (240, 240, 240)  # what a picture shows where there is nothing to show yet


def _upscale(a: np.ndarray, grid: int, cell: int) -> np.ndarray:
    """Per-token values [grid*grid, C] -> per-pixel [grid*cell, grid*cell, C]."""
    return np.kron(a.reshape(grid, grid, -1), np.ones((cell, cell, 1)))


def _dim(image: np.ndarray, dimmed: np.ndarray, grid: int) -> np.ndarray:
    """uint8 image [S, S, 3] with the tokens `dimmed` [N] darkened (not reached yet)."""
    cell = image.shape[0] // grid
    out = image.astype(np.float32) * (1 - 0.7 * _upscale(dimmed.astype(np.float32), grid, cell))
    return out.clip(0, 255).astype(np.uint8)


def _outline(image: np.ndarray, regions: list[tuple[np.ndarray, tuple]], grid: int, width: int = 2) -> np.ndarray:
    """uint8 image [S, S, 3] with each region (a token mask [N] and a colour) outlined on the inside of its
    border, `width` px: outlines, not tints, so an object under a region keeps its colour (red rejection over a
    red object stays readable)."""
    cell = image.shape[0] // grid
    out = image.copy()
    for mask, colour in regions:
        inside = _upscale(mask.astype(np.float32), grid, cell)[..., 0] > 0
        core = inside.copy()  # eroded by `width` px in the four directions; outside the picture counts as out
        for _ in range(width):
            shrunk = core.copy()
            shrunk[1:] &= core[:-1]
            shrunk[:-1] &= core[1:]
            shrunk[:, 1:] &= core[:, :-1]
            shrunk[:, :-1] &= core[:, 1:]
            shrunk[0], shrunk[-1], shrunk[:, 0], shrunk[:, -1] = False, False, False, False
            core = shrunk
        out[inside & ~core] = colour
    return out


def round_labels(rnd, i: int) -> dict[str, np.ndarray]:
    """What happened to each token of image i in a round, as disjoint masks [N] (see ROUND_COLOURS): rejected,
    resampled by expansion only, accepted and kept, drafted with no verdict."""
    rejected = rnd.rejected[i].numpy()
    expanded = rnd.resampled[i].numpy() & ~rejected
    accepted = rnd.accepted[i].numpy() & ~rejected & ~expanded
    drafted = rnd.drafted[i].numpy() & ~rejected & ~expanded & ~accepted
    return {"accepted": accepted, "rejected": rejected, "expanded": expanded, "drafted": drafted}


def _regions(labels: dict[str, np.ndarray]) -> list[tuple[np.ndarray, tuple]]:
    return [(mask, ROUND_COLOURS[name]) for name, mask in labels.items() if mask.any()]


def _legend(draw, font, names, x: int = 4) -> None:
    for name in names:
        draw.rectangle([x, 6, x + 10, 16], fill=ROUND_COLOURS[name])
        draw.text((x + 14, 4), name, fill=(20, 20, 20), font=font)
        x += 26 + 8 * len(name)


def acceptance_maps(images: list[np.ndarray], rounds: list, grid: int, cell: int = 12) -> Image.Image:
    """One row per image: a tile per MuLo-SD round (titled round 1, round 2, ...), then the result. A tile
    shows the final image, dimmed where the round had not reached yet, with the round's regions outlined:
    accepted drafts green, rejected red, resampled by expansion only yellow, drafted with no verdict blue.
    The legend lists only the colours that appear."""
    size = grid * cell
    head = 40
    labels = [[round_labels(rnd, i) for rnd in rounds] for i in range(len(images))]
    present = [name for name in ROUND_COLOURS if any(lab[name].any() for row in labels for lab in row)]
    width = max((len(rounds) + 1) * (size + 4) + 4, 8 + sum(26 + 8 * len(name) for name in present))
    sheet = Image.new("RGB", (width, head + len(images) * (size + 4)), (255, 255, 255))
    draw, font = ImageDraw.Draw(sheet), _font()
    _legend(draw, font, present)
    for k, title in enumerate([f"round {k + 1}" for k in range(len(rounds))] + ["result"]):
        draw.text((4 + k * (size + 4), 24), title, fill=(20, 20, 20), font=font)
    for i, image in enumerate(images):
        base = np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.NEAREST))
        y = head + i * (size + 4)
        done = np.zeros(grid * grid, dtype=bool)
        for k, rnd in enumerate(rounds):
            reached = done | rnd.drafted[i].numpy()
            tile = _outline(_dim(base, ~reached, grid), _regions(labels[i][k]), grid)
            sheet.paste(Image.fromarray(tile), (4 + k * (size + 4), y))
            done = reached
        sheet.paste(Image.fromarray(base), (4 + len(rounds) * (size + 4), y))
    return sheet


# distinct colours for rejection islands (cycled when a round has more)
ISLAND_COLOURS = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
                  (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


@torch.no_grad()
def round_panels(tokenizer, rnd, final: torch.Tensor, i: int = 0, size: int = 192) -> dict[str, np.ndarray]:
    """The steps of one MuLo-SD round for image i, as pictures `size` px wide (nearest-neighbour), showing
    only the rows that exist once the round has drafted its block (the rest blank):
    low-res draft (M_q's grid after drafting the block) | up-sampled draft (U_r) | verifier acceptance
    (outlined: accepted green, rejected red, expanded yellow) | rejection islands (one outline colour each,
    resampled concurrently) | committed (the block after resampling). `final` [B, G, G] is the decoded token
    grid: rows a round commits never change later."""
    from .decoding.islands import raster_linked_islands
    from .tokenizer import tokens_to_images

    if rnd.low_draft is None or rnd.high_draft is None:
        raise ValueError("this round carries no drafts (only decode_mulosd records them)")
    G = final.shape[-1]
    g = int(round(rnd.low_draft.shape[1] ** 0.5))
    r = G // g
    block = rnd.drafted[i].view(G, G).any(1).nonzero().flatten()
    row1 = int(block.max()) + 1  # rows [0, row1) are committed once this round ends

    device = next(tokenizer.parameters()).device

    def picture(tokens, grid, rows):
        """Rows [0, rows) decoded on their own, the rest blank: the decoder never sees the placeholder tokens
        of rows not drafted yet, which would bleed into the colours of the rows above."""
        canvas = np.full((size, size, 3), BLANK, np.uint8)
        if rows:
            part = tokens.view(1, grid, grid)[:, :rows].to(device)
            image = tokens_to_images(tokenizer, part)[0]
            height = round(size * rows / grid)
            canvas[:height] = np.asarray(Image.fromarray(image).resize((size, height), Image.Resampling.NEAREST))
        return canvas

    low = picture(rnd.low_draft[i], g, row1 // r)
    up = picture(rnd.high_draft[i], G, row1)
    verdict = _outline(up, _regions(round_labels(rnd, i)), G)
    redo = rnd.resampled[i].view(G, G).numpy()
    islands = []
    for j, positions in enumerate(raster_linked_islands(redo)):
        mask = np.zeros(G * G, bool)
        mask[positions] = True
        islands.append((mask, ISLAND_COLOURS[j % len(ISLAND_COLOURS)]))
    isl = _outline(up, islands, G)
    committed = picture(final[i].flatten().cpu(), G, row1)
    return {"low-res draft (M_q)": low, "up-sampled draft (U_r)": up, "verifier acceptance": verdict,
            "rejection islands": isl, "committed": committed}
