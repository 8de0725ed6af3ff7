"""The pictures: acceptance maps (titles, a legend of the colours that appear, outlines that leave the object
visible) and the walkthrough's round panels (a draft panel shows exactly the rows drafted so far)."""

import numpy as np
import pytest
import torch
from PIL import Image

from mulosd.data.images import to_image
from mulosd.decoding.trace import Round
from mulosd.tokenizer import VQConfig, VQModel
from mulosd.viz import BLANK, ROUND_COLOURS, acceptance_maps, round_panels

G, CELL = 8, 8


def _round(block_rows, rejected=(), expanded=(), B=1):
    n = G * G
    drafted = torch.zeros(B, n, dtype=torch.bool)
    drafted[:, block_rows[0] * G:block_rows[1] * G] = True
    rej, res = torch.zeros(B, n, dtype=torch.bool), torch.zeros(B, n, dtype=torch.bool)
    rej[:, list(rejected)] = True
    res[:, list(rejected) + list(expanded)] = True
    return Round(drafted=drafted, accepted=drafted & ~res, rejected=rej, resampled=res)


def _pixels_of(sheet: Image.Image, colour, box) -> int:
    a = np.asarray(sheet.crop(box)).reshape(-1, 3)
    return int((a == np.array(colour)).all(1).sum())


def test_the_legend_lists_only_the_colours_that_appear_and_tiles_are_titled():
    image = np.full((G * CELL, G * CELL, 3), 128, np.uint8)
    rounds = [_round((0, 4), rejected=[10, 11]), _round((4, 8))]  # nothing expanded, nothing left unverified
    sheet = acceptance_maps([image], rounds, G, CELL)
    legend = (0, 0, sheet.width, 20)
    assert _pixels_of(sheet, ROUND_COLOURS["accepted"], legend) > 0
    assert _pixels_of(sheet, ROUND_COLOURS["rejected"], legend) > 0
    assert _pixels_of(sheet, ROUND_COLOURS["expanded"], legend) == 0
    assert _pixels_of(sheet, ROUND_COLOURS["drafted"], legend) == 0
    titles = np.asarray(sheet.crop((0, 22, sheet.width, 38)).convert("L"))
    for k in range(3):  # "round 1", "round 2", "result": dark text above each column
        column = titles[:, 4 + k * (G * CELL + 4): 4 + k * (G * CELL + 4) + G * CELL]
        assert (column < 100).sum() > 10, k
    with_expansion = acceptance_maps([image], [_round((0, 8), rejected=[10], expanded=[11, 12])], G, CELL)
    assert _pixels_of(with_expansion, ROUND_COLOURS["expanded"], (0, 0, with_expansion.width, 20)) > 0


def test_a_rejected_region_is_outlined_and_the_object_under_it_keeps_its_colour():
    red = np.zeros((G * CELL, G * CELL, 3), np.uint8)
    red[...] = (200, 30, 30)  # a red object filling the picture
    # a 3x3 token rejection: its inner cell must show the object untouched
    rejected = [r * G + c for r in (1, 2, 3) for c in (2, 3, 4)]
    sheet = np.asarray(acceptance_maps([red], [_round((0, 8), rejected=rejected)], G, CELL))
    tile = sheet[40:40 + G * CELL, 4:4 + G * CELL]
    inner = tile[2 * CELL + 2:3 * CELL - 2, 3 * CELL + 2:4 * CELL - 2]
    assert (inner == (200, 30, 30)).all()
    edge = tile[1 * CELL, 2 * CELL + 4]  # the top border row of the rejected region
    assert tuple(edge) == ROUND_COLOURS["rejected"]


@pytest.fixture(scope="module")
def tokenizer():
    torch.manual_seed(0)
    return VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()


def test_draft_panels_show_exactly_the_drafted_rows(tokenizer):
    """Round 1 of 2 at r = 2: high-res rows 0-7 drafted (low-res rows 0-3). The up-sampled panel is those rows
    decoded on their own over a blank rest; the tokens of rows not drafted yet never change it."""
    G16, g, size = 16, 8, 192
    gen = torch.Generator().manual_seed(1)
    low = torch.randint(0, 32, (1, g * g), generator=gen)
    high = torch.randint(0, 32, (1, G16 * G16), generator=gen)
    drafted = torch.zeros(1, G16 * G16, dtype=torch.bool)
    drafted[:, :8 * G16] = True
    empty = torch.zeros_like(drafted)
    rnd = Round(drafted=drafted, accepted=drafted, rejected=empty, resampled=empty, low_draft=low, high_draft=high)
    final = high.view(1, G16, G16)
    panels = round_panels(tokenizer, rnd, final, size=size)
    up = panels["up-sampled draft (U_r)"]
    with torch.no_grad():
        rows = to_image(tokenizer.decode(high.view(1, G16, G16)[:, :8]).clamp(-1, 1)[0])
    expected = np.asarray(Image.fromarray(rows).resize((size, size // 2), Image.Resampling.NEAREST))
    assert np.array_equal(up[:size // 2], expected)
    assert (up[size // 2:] == BLANK).all()
    # placeholder tokens in the undrafted rows (0 in the recorded grid, or anything else) change nothing
    for placeholder in (0, 7):
        later = high.clone().view(1, G16, G16)
        later[:, 8:] = placeholder
        low_later = low.clone().view(1, g, g)
        low_later[:, 4:] = placeholder
        other = Round(drafted=drafted, accepted=drafted, rejected=empty, resampled=empty,
                      low_draft=low_later.view(1, -1), high_draft=later.view(1, -1))
        again = round_panels(tokenizer, other, later, size=size)
        for name in ("low-res draft (M_q)", "up-sampled draft (U_r)", "committed"):
            assert np.array_equal(again[name], panels[name]), name
