"""Local rejection: expansion of the rejected set, its split into islands that resample in parallel, and the
order each island resamples in (`IslandSchedule`).

N(t, l) = {u : |i_u - i_t| <= l, |j_u - j_t| <= l, u >= t0}: each rejected position drags its (2l+1)^2
neighbourhood along, but never a position before the first rejected one t0 (raster order), which stays
accepted. Islands are the 8-connected components of R_X.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

EIGHT = np.ones((3, 3), dtype=bool)


def first_rejected(rejected: torch.Tensor) -> torch.Tensor:
    """[B, H, W] bool -> raster index of the first rejected position per image (H*W where none)."""
    flat = rejected.flatten(1)
    n = flat.shape[1]
    idx = torch.where(flat, torch.arange(n, device=flat.device), n)
    return idx.min(1).values


def expand(rejected: torch.Tensor, radius: int, rejection: str = "local") -> torch.Tensor:
    """R_T [B, H, W] -> R_X. `local`: dilation by the radius, restricted to u >= t0; `raster`: every u >= t0."""
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    B, H, W = rejected.shape
    t0 = first_rejected(rejected)
    after = torch.arange(H * W, device=rejected.device)[None] >= t0[:, None]
    if rejection == "raster":
        return after.view(B, H, W)
    if rejection != "local":
        raise ValueError(f"rejection must be local or raster, got {rejection!r}")
    grown = rejected
    if radius > 0:
        grown = F.max_pool2d(rejected.float()[:, None], 2 * radius + 1, stride=1, padding=radius)[:, 0] > 0
    return grown & after.view(B, H, W)


def islands(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of a [H, W] bool mask -> (labels 1..n, 0 outside; n)."""
    labels, n = ndimage.label(mask, structure=EIGHT)
    return labels, n


def raster_linked_islands(mask: np.ndarray) -> list[np.ndarray]:
    """Islands for resampling: 8-connected components, merged where a row's last position and the next row's
    first both need resampling. The AR model predicts position u from the slot of u - 1, and the raster
    predecessor of a row start is the previous row's end: merging makes every query's predecessor either
    fixed or resampled earlier in the same island. Returns each island's raster positions, sorted."""
    labels, n = islands(mask)
    parent = list(range(n + 1))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for y in range(mask.shape[0] - 1):
        a, b = labels[y, -1], labels[y + 1, 0]
        if a and b:
            parent[find(a)] = find(b)
    flat = labels.flatten()
    groups: dict[int, list[int]] = {}
    for pos in np.flatnonzero(flat):
        groups.setdefault(find(int(flat[pos])), []).append(int(pos))
    return sorted((np.array(g) for g in groups.values()), key=lambda g: g[0])


def _blockers(island: list[int], grid: int, reach: int) -> list[list[int]]:
    """Per position of a raster-sorted island, the indices of the earlier positions standing for all it waits
    for: the last one of its own row, and in each earlier row the last one within `reach` columns to its right.
    A position waits for its row's earlier positions, so an island row is decided front to back; the last of
    a run being final (or a standing draft) vouches for the run."""
    out, rows = [], {}  # rows: grid row -> (columns, indices) of its positions so far, in order
    for i, u in enumerate(island):
        row, col = divmod(u, grid)
        mine = [rows[row][1][-1]] if row in rows else []
        earlier = [ks[bisect.bisect_right(cols, col + reach) - 1] for r, (cols, ks) in rows.items()
                   if r != row and cols[0] <= col + reach]
        out.append(earlier + mine)
        cols, ks = rows.setdefault(row, ([], []))
        cols.append(col)
        ks.append(i)
    return out


def _row_ends(island: list[int], grid: int) -> list[int]:
    """Per position of a raster-sorted island, the index just after the last position of its grid row."""
    rows = [u // grid for u in island]
    return [bisect.bisect_right(rows, row) for row in rows]


class IslandSchedule:
    """The order in which one image resamples its islands of R_X.

    Each island is a raster-sorted list of grid positions; position i of an island waits for the island's
    earlier positions it needs final first. With `reach` >= the grid width that is every earlier position (raster
    order within the island); with ZipAR's reach w - 1 a position (i, j) waits only for its own row's earlier
    positions and earlier rows' up to column j + w - 1. `blockers[i]` holds the few that stand for them all
    (`_blockers`). Islands never wait for each other: they resample side by side."""

    def __init__(self, islands: list[list[int]], grid: int, reach: int):
        self.islands, self.grid = islands, grid
        self.blockers = [_blockers(island, grid, reach) for island in islands]
        self.row_end = [_row_ends(island, grid) for island in islands]
        self.done = [[False] * len(island) for island in islands]
        self._index = [{p: i for i, p in enumerate(island)} for island in islands]

    @classmethod
    def of(cls, redo: torch.Tensor, start: int, grid: int, mode: str, window: int) -> IslandSchedule:
        """The schedule of a block's R_X, redo [n] bool starting at raster position `start`. mode: `parallel`
        (islands side by side, raster within each), `serial` (all of R_X as one island) or `zipar`."""
        isl = [[start + int(p) for p in island]
               for island in raster_linked_islands(redo.view(-1, grid).cpu().numpy())]
        if mode == "serial" and isl:
            isl = [sorted(p for island in isl for p in island)]
        return cls(isl, grid, window - 1 if mode == "zipar" else grid)

    @property
    def first(self) -> int | None:
        """t0, the first position of R_X (None when nothing is to be resampled)."""
        return self.islands[0][0] if self.islands else None

    def ready(self, tentative: set[int] | None = None, window: int | None = None) -> list[tuple[int, int, int]]:
        """(position, island, index) of every position not done whose blockers all are. With `tentative` (the
        positions holding a draft that may stand), also every position whose blockers not done are all
        tentative and ready themselves: a speculative query, whose answer holds only if they stand. With
        `window` (Jacobi windows along rows) a query runs ahead only of its own row's drafts, and at most
        `window` positions of an island's row are asked at once."""
        out = []
        for j, island in enumerate(self.islands):
            done, blockers, row_end = self.done[j], self.blockers[j], self.row_end[j]
            live = [False] * len(island)
            i = 0
            while i < len(island):
                if done[i]:  # a row's done positions are a prefix of it (it is decided front to back)
                    i += 1
                    continue
                # a position waits for the one before it in its row: once one cannot be asked, neither can the
                # rest of its row, so the scan goes on at the next row
                end, row, asked = row_end[i], island[i] // self.grid, 0
                while i < end and (window is None or asked < window):
                    live[i] = all(done[k] or (live[k] and tentative is not None and island[k] in tentative
                                              and (window is None or island[k] // self.grid == row))
                                  for k in blockers[i])
                    if not live[i]:
                        break
                    asked += 1
                    out.append((island[i], j, i))
                    i += 1
                i = end
        return out

    def mark(self, j: int, i: int) -> None:
        self.done[j][i] = True

    def pending(self, j: int, p: int) -> bool:
        """Whether position p belongs to island j and is still to be resampled."""
        i = self._index[j].get(p)
        return i is not None and not self.done[j][i]

    def first_pending(self, default: int) -> int:
        """The earliest position of any island still to be resampled (`default` when none is)."""
        return min((p for island, flags in zip(self.islands, self.done, strict=True)
                    for p, f in zip(island, flags, strict=True) if not f), default=default)

    def pending_in_row(self, j: int, row: int) -> list[int]:
        """Island j's positions in grid row `row` still to be resampled, in raster order."""
        return [p for p, f in zip(self.islands[j], self.done[j], strict=True) if p // self.grid == row and not f]

    def row_size(self, j: int, row: int) -> int:
        return sum(p // self.grid == row for p in self.islands[j])
