"""MuLo-SD: multi-scale local speculative decoding.

Per round, for a block of `draft_rows` low-res rows (r * draft_rows high-res rows):
1. the low-res drafter M_q drafts the block, serially or ZipAR-staggered (`draft=zipar`, window
   `draft_window`), after writing the previous block's down-sampled committed tokens into its cache in one
   forward (which also overwrites any provisional ZipAR slot: its context is always the verifier's image);
2. U_r up-samples the low-res prefix (row-causal, so the new rows depend on committed rows and this draft);
3. the verifier M_p checks the whole high-res block in one forward;
4. pooled acceptance: sum over B_k(x~) of p >= tau (optional TVD cap delta); `acceptance=sampled` accepts
   with probability min(1, that mass / tau) instead, `acceptance=ratio` with min(1, mass / (tau q)), q the
   drafter's pooled mass of the low-res token x~ was up-sampled from, and both redraw a rejected position
   outside B_k(x~) (acceptance.py);
5. local rejection: R_X = rejected positions grown by `radius`, never before the first rejected one, t0
   (`rejection=raster` takes every position from t0 on);
6. R_X splits into islands (8-connected, see islands.py) resampled concurrently, one query per island per
   step (`resample=parallel`), ZipAR within islands (`zipar`: an island's rows advance together, window
   `resample_window`), or one island after another (`serial`);
7. the committed block is down-sampled by D_r for M_q's next round.

Stale KV entries. The verification forward writes K/V for every drafted position; those of accepted positions
after t0 were computed with rejected drafts in their context. The rule: rejected positions are un-filled at
once (`keep_rejected=true` leaves them as placeholders until resampled, an ablation); accepted ones after t0
are counted as `stale_kv`; with `kv_refresh=eager` each is rewritten in the first resampling forward after
every position before it is final (a few more tokens in forwards that run anyway, no extra step), with
`round` they wait; either way the next round's verification forward rewrites the whole committed previous
block together with the new draft, in the same single forward, so every later round sees exact entries (all
rewrites counted as `refreshed`). `kv_refresh=none` accepts the approximation: the
verification forward writes only the previous round's last samples, never written yet, so stale entries stay,
as do the holes ZipAR resampling leaves (decode_zipar lives with both), and the forward carries half the
tokens. The drafter's cache is exact: it re-reads the down-sampled committed block.

Randomness: the verifier samples position p with the same key AR uses, (seed, image, p); the drafter draws
with its own stream. Hence `tau > 1` with serial resampling reproduces `ar` token for token, and `tau = 0`
returns the up-sampled draft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import outside_pool, pooled_accept, pooled_mass, sampled_accept
from .islands import expand, first_rejected, raster_linked_islands
from .knobs import check, one_of
from .trace import Round, Trace
from .zipar import zipar_rows


@dataclass(frozen=True)
class MuLoSDConfig:
    tau: float = 0.5
    pool_k: int = 8
    delta: float | None = None
    radius: int = 1
    rejection: str = "local"  # local | raster
    resample: str = "parallel"  # parallel | serial | zipar (an island's rows advance together)
    keep_rejected: bool = False  # rejected drafts stay in the verifier's context as placeholders until resampled
    kv_refresh: str = "round"  # round | eager | none: when (if ever) accepted positions after t0 get K/V from their
    # final context
    resample_window: int = 2  # ZipAR window (high-res tokens) when resample=zipar: (i, j) waits for (i-1, j+w-1)
    draft_rows: int = 1  # low-res rows drafted per round
    draft: str = "serial"  # serial | zipar: the block's rows drafted one after another, or ZipAR-staggered
    draft_window: int = 4  # ZipAR window (low-res tokens) when draft=zipar
    draft_temperature: float | None = None  # the drafter's temperature (0 = its mode); None = the verifier's
    relative: bool = False  # pooled mass against the mode's pooled mass instead of against 1
    # threshold: mass >= tau | sampled: with probability min(1, mass / tau) | ratio: min(1, mass / (tau q)), q the
    # drafter's pooled mass of the low-res token the position was up-sampled from
    acceptance: str = "threshold"

    REJECTIONS: ClassVar = ("local", "raster")
    RESAMPLES: ClassVar = ("parallel", "serial", "zipar")
    KV_REFRESHES: ClassVar = ("eager", "round", "none")
    DRAFTS: ClassVar = ("serial", "zipar")
    ACCEPTANCES: ClassVar = ("threshold", "sampled", "ratio")

    def __post_init__(self):
        check(self.tau >= 0, "tau", f"must be >= 0, got {self.tau}")  # NaN fails too; > 1 rejects every draft
        check(self.pool_k >= 0, "pool_k", f"must be >= 0, got {self.pool_k}")
        check(self.delta is None or 0 <= self.delta <= 1, "delta", f"must be in [0, 1] or null, got {self.delta}")
        check(self.radius >= 0, "radius", f"must be >= 0, got {self.radius}")
        one_of(self.rejection, self.REJECTIONS, "rejection")
        one_of(self.resample, self.RESAMPLES, "resample")
        one_of(self.kv_refresh, self.KV_REFRESHES, "kv_refresh")
        one_of(self.draft, self.DRAFTS, "draft")
        one_of(self.acceptance, self.ACCEPTANCES, "acceptance")
        for key in ("resample_window", "draft_window", "draft_rows"):
            check(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        t = self.draft_temperature
        check(t is None or t >= 0, "draft_temperature", f"must be >= 0, got {t}")
        check(self.acceptance == "threshold" or not self.relative, "relative", "applies to acceptance=threshold only")


def _sample_draft(logits, warpers, seed, ids, pos, q_pool=None):
    """The drafter's own draw: Gumbel-max on its own noise stream (independent of the verifier's).
    `q_pool` = (mass [B, g*g], neighbours, k): record the drafter's pooled mass of each drawn token there."""
    logq = warp(logits, warpers)
    x = sample(logq, seed, ids, pos, stream=DRAFT)
    if q_pool is not None:
        mass, neighbours, k = q_pool
        mass.scatter_(1, pos, pooled_mass(logq, x, neighbours, k).to(mass.dtype))
    return x


@torch.no_grad()
def decode_mulosd(verifier: ARBackbone, drafter: ARBackbone, up: Callable, down: Callable, captions: list[str],
                  neighbours: torch.Tensor, cfg: MuLoSDConfig = MuLoSDConfig(), seed: int = 0,
                  warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
                  progress=None, accept: Callable | None = None) -> tuple[torch.Tensor, Trace]:
    """-> high-res tokens [B, G, G] and the trace. `up(tokens_low [B,h,w]) -> [B,rh,rw]`, `down` the reverse.
    `accept(logp [B,n,V], draft [B,n]) -> bool [B,n]` replaces pooled acceptance (the GPU cost model forces
    acceptance rates with it)."""
    warpers = warpers or Warpers()
    # the drafter proposes and only the verifier's test decides what stays, so it may draw colder than the verifier
    # samples (what that buys and costs: docs/results.md)
    draft_warpers = warpers if cfg.draft_temperature is None else replace(warpers, temperature=cfg.draft_temperature)
    B, G, g = len(captions), verifier.grid, drafter.grid
    if G % g:
        raise ValueError(f"verifier grid {G} is not a multiple of the drafter grid {g}")
    r, d = G // g, cfg.draft_rows
    if g % d:
        raise ValueError(f"draft_rows={d} must divide the drafter's {g} rows")
    device = verifier.device
    ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
    for bb in (verifier, drafter):
        bb.calls = bb.tokens_in = 0
    trace = Trace("mulosd").start()
    trace.counts = {"drafted": 0, "accepted": 0, "resampled": 0, "stale_kv": 0, "refreshed": 0, "up_calls": 0,
                    "down_calls": 0, "provisional_kv": 0}
    low = torch.zeros(B, g * g, dtype=torch.long, device=device)
    q_pool = (torch.ones(B, g * g, device=device), neighbours, cfg.pool_k) if cfg.acceptance == "ratio" else None
    # each high-res position's parent on the low-res grid (U_r maps a low-res token to an r x r patch)
    parent = torch.arange(G * G, device=device)
    parent = (parent // G // r) * g + (parent % G) // r
    high = torch.zeros(B, G * G, dtype=torch.long, device=device)
    lq = drafter.start(captions)
    lp = verifier.start(captions)
    steps = 1  # the two prefix forwards are independent: one step on the critical path
    unwritten: list[list[int]] = [[] for _ in range(B)]  # per image: sampled last round, not in the cache yet
    block_lo, block_hi = d * g, r * d * G
    for k in range(g // d):
        lo0, lo1 = k * block_lo, (k + 1) * block_lo
        hi0, hi1 = k * block_hi, (k + 1) * block_hi
        # 1. draft the low-res block (first writing the previous block's down-sampled tokens)
        if k > 0:
            prev = torch.arange(lo0 - block_lo, lo0, device=device).expand(B, -1)
            lq = drafter(prev, low.gather(1, prev))[:, -1:]
            steps += 1
        window = g if cfg.draft == "serial" else cfg.draft_window  # a full-row window is serial drafting
        steps += zipar_rows(drafter, low, k * d, d, window, lq,
                            lambda logits, pos: _sample_draft(logits, draft_warpers, seed, ids, pos, q_pool),
                            trace.counts)
        # 2. up-sample the low-res prefix; U_r is row-causal, so only this block's rows are new
        draft = up(low[:, :lo1].view(B, lo1 // g, g)).reshape(B, -1)[:, hi0:hi1]
        trace.counts["up_calls"] += 1
        # 3. verify the block in one forward; it also rewrites the committed previous block (stale-KV refresh),
        # or with kv_refresh=none only what the previous round sampled last and never wrote
        if k == 0:
            committed = torch.empty(B, 0, dtype=torch.long, device=device)
        elif cfg.kv_refresh == "none":  # the block's last position too: its output is the new block's first
            committed = torch.cat([_padded(unwritten, hi0 - 1, device), torch.full((B, 1), hi0 - 1, device=device)], 1)
        else:
            committed = torch.arange(hi0 - block_hi, hi0, device=device).expand(B, -1)
            trace.counts["refreshed"] += B * block_hi
        positions = torch.cat([committed, torch.arange(hi0, hi1 - 1, device=device).expand(B, -1)], dim=1)
        out = verifier(positions, torch.cat([high.gather(1, committed), draft[:, :-1]], dim=1))
        logits = out[:, -block_hi:] if k > 0 else torch.cat([lp, out], dim=1)
        steps += 1
        logp = warp(logits, warpers)
        # 4-5. pooled acceptance, local rejection with expansion
        sampled = cfg.acceptance in ("sampled", "ratio") and accept is None
        if accept is not None:
            accepted = accept(logp, draft)
        elif sampled:
            u = uniform(seed, ids, torch.arange(hi0, hi1, device=device).expand(B, -1), ACCEPT)
            q = None if q_pool is None else q_pool[0][:, parent[hi0:hi1]]
            accepted = sampled_accept(logp, draft, neighbours, cfg.pool_k, cfg.tau, u, cfg.delta, q)
        else:
            accepted = pooled_accept(logp, draft, neighbours, cfg.pool_k, cfg.tau, cfg.delta, cfg.relative)
        rejected = ~accepted
        rows = r * d
        redo = expand(rejected.view(B, rows, G), cfg.radius, cfg.rejection).reshape(B, -1)
        high[:, hi0:hi1] = draft
        drafted_low, drafted_high = low.cpu().clone(), high.cpu().clone()
        if not cfg.keep_rejected:
            verifier.forget_mask(_on_grid(redo, hi0, G * G))  # rejected drafts leave the verifier's context
        t0 = first_rejected(redo.view(B, rows, G))
        stale = ~redo & (torch.arange(rows * G, device=device)[None] > t0[:, None])  # accepted after t0
        trace.counts["stale_kv"] += int(stale.sum())
        # 6. islands, resampled concurrently (or one after another)
        # a sampled rejection is redrawn outside the draft's pool; positions only grown into R_X draw from p
        n_steps, unwritten = _resample(verifier, high, redo, hi0, logp, warpers, seed, ids, cfg.resample,
                                       cfg.resample_window, stale if cfg.kv_refresh == "eager" else None,
                                       trace.counts, (rejected, draft, neighbours, cfg.pool_k) if sampled else None)
        steps += n_steps
        n_drafted = B * rows * G
        trace.counts["drafted"] += n_drafted
        trace.counts["accepted"] += int((~redo).sum())
        trace.counts["resampled"] += int(redo.sum())
        trace.rounds.append(Round(*(_on_grid(m, hi0, G * G).cpu() for m in
                                    (torch.ones_like(redo), accepted & ~redo, rejected, redo)),
                                  low_draft=drafted_low, high_draft=drafted_high))
        # 7. down-sample the committed rows for the drafter's next round
        if k + 1 < g // d:
            low[:, lo0:lo1] = down(high[:, :hi1].view(B, hi1 // G, G)).reshape(B, -1)[:, lo0:lo1]
            trace.counts["down_calls"] += 1
        if progress is not None:
            progress.update(1)
    trace.steps = steps
    return high.view(B, G, G), trace.stop(verifier=verifier, drafter=drafter)


def _on_grid(block_mask: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """A block's mask [B, m] placed at raster offset `start` on the whole grid [B, n]."""
    out = torch.zeros(block_mask.shape[0], n, dtype=torch.bool, device=block_mask.device)
    out[:, start:start + block_mask.shape[1]] = block_mask
    return out


def _resample(verifier: ARBackbone, high: torch.Tensor, redo: torch.Tensor, hi0: int, logp: torch.Tensor,
              warpers: Warpers, seed: int, ids: torch.Tensor, mode: str, window: int,
              refresh: torch.Tensor | None, counts: dict, outside=None) -> tuple[int, list[list[int]]]:
    """Resample every position of R_X (redo [B, n], the block starting at hi0) in place in `high`; returns the
    number of sequential verifier forwards and, per image, the positions sampled but not yet written (the last
    step's samples: the next verification forward writes them). `refresh` [B, n]: the accepted positions after
    t0 to rewrite once their context is final (kv_refresh=eager), or None.

    Each step queries, per island, every position u that is ready: one forward writes u's predecessor (whose
    output is u's distribution) and the tokens sampled in the previous step. `parallel`: an island's
    positions go one per step in raster order (islands side by side); `serial`: all of R_X as one island;
    `zipar`: an island's rows advance together, u = (i, j) waiting only for the island's earlier positions in
    row i and those of earlier rows up to column j + window - 1 (ZipAR's rule, decode_zipar's window: what it
    does not wait for is a hole in its context). A row start whose predecessor, the previous row's end, is
    still to be resampled is queried through a provisional slot, as decode_zipar does: the previous row's
    latest final token written there, rewritten with the real one once sampled (counted as `provisional_kv`).
    The first position of R_X, t0, needs no query: its context is committed and unchanged, so the
    verification forward's distribution is exact. An image with nothing to do in a step rewrites a position
    whose context is final (a no-op), so an image decodes the same alone and in a batch."""
    B, n = redo.shape
    G = verifier.grid
    reach = window - 1 if mode == "zipar" else G  # a full-row reach waits for every earlier position: raster
    schedules = []  # per image: per island, (positions, blockers: for each position the indices it waits for)
    for b in range(B):
        isl = [[hi0 + int(p) for p in island]
               for island in raster_linked_islands(redo[b].view(n // G, G).cpu().numpy())]
        if mode == "serial" and isl:
            isl = [sorted(p for island in isl for p in island)]
        schedules.append([(island, [[k for k, v in enumerate(island[:i]) if v // G == u // G or v % G <= u % G + reach]
                                    for i, u in enumerate(island)]) for island in isl])
    done = [[[False] * len(island) for island, _ in sched] for sched in schedules]
    unwritten: list[set[int]] = [set() for _ in range(B)]
    # t0 first, straight from the verification forward (islands are sorted by start)
    firsts = [(b, sched[0][0][0]) for b, sched in enumerate(schedules) if sched]
    _sample_at(high, logp, [(b, t0, t0 - hi0) for b, t0 in firsts], seed, ids, hi0, outside)
    for b, t0 in firsts:
        unwritten[b].add(t0)
        done[b][0][0] = True
    # eager refresh: accepted positions after t0 hold K/V computed with rejected drafts in view; each is rewritten
    # in the first forward after every position before it is final (no extra forward: the ones that become
    # final only with the round's last samples are rewritten by the next round's verification forward)
    stale = [[] if refresh is None else (hi0 + torch.nonzero(refresh[b]).flatten()).tolist() for b in range(B)]
    steps = 0
    while True:
        writes, targets = [], []  # per image: [(position, token)], [(u, island, index, index of u-1 in writes)]
        for b in range(B):
            w = {p: int(high[b, p]) for p in sorted(unwritten[b])}  # finished islands' last tokens too
            if stale[b]:
                undone = min((p for (island, _), flags in zip(schedules[b], done[b], strict=True)
                              for p, f in zip(island, flags, strict=True) if not f), default=n + hi0)
                final = [p for p in stale[b] if p < undone]
                w |= {p: int(high[b, p]) for p in final}
                counts["refreshed"] += len(final)
                stale[b] = stale[b][len(final):]
            t = [(island[i], j, i) for j, (island, blockers) in enumerate(schedules[b]) for i in range(len(island))
                 if not done[b][j][i] and all(done[b][j][k] for k in blockers[i])]
            for u, j, _ in t:
                island, flags = schedules[b][j][0], done[b][j]
                if u - 1 in island and not flags[island.index(u - 1)]:  # a row start ahead of its predecessor
                    row = [p for p, f in zip(island, flags, strict=True) if p // G == (u - 1) // G and not f]
                    latest = row[0] - 1  # the previous row's last final token
                    w[u - 1] = int(high[b, latest])
                    counts["provisional_kv"] += sum(p // G == u // G for p in island) - 1  # the row's others
                else:
                    w.setdefault(u - 1, int(high[b, u - 1]))
            writes.append(list(w.items()))
            targets.append([(u, j, i, list(w).index(u - 1)) for u, j, i in t])
        if not any(targets):
            return steps, [sorted(w) for w in unwritten]
        width = max(len(w) for w in writes)
        pos = torch.empty(B, width, dtype=torch.long, device=high.device)
        tok = torch.empty_like(pos)
        for b, w in enumerate(writes):
            # pad by repeating the last write; a finished image rewrites a position whose token and context
            # are final (it makes no more queries this round, so nothing it does here can change its image)
            w = w or [(max(hi0 - 1, 0), int(high[b, max(hi0 - 1, 0)]))]
            w = w + [w[-1]] * (width - len(w))
            pos[b], tok[b] = torch.tensor([p for p, _ in w]), torch.tensor([x for _, x in w])
        out = warp(verifier(pos, tok), warpers)
        steps += 1
        _sample_at(high, out, [(b, u, k) for b in range(B) for u, _, _, k in targets[b]], seed, ids, hi0, outside)
        for b in range(B):
            unwritten[b].difference_update(p for p, _ in writes[b])
            for u, j, i, _ in targets[b]:
                unwritten[b].add(u)
                done[b][j][i] = True


def _padded(rows: list[list[int]], fill: int, device) -> torch.Tensor:
    """Per-image position lists -> [B, longest], short rows padded with `fill` (a position the forward writes
    anyway: a duplicate write of one slot in one forward computes the same K/V twice)."""
    width = max(map(len, rows), default=0)
    return torch.tensor([row + [fill] * (width - len(row)) for row in rows], dtype=torch.long,
                        device=device).view(len(rows), width)


def _sample_at(high: torch.Tensor, logp: torch.Tensor, picks: list[tuple[int, int, int]], seed: int,
               ids: torch.Tensor, hi0: int, outside=None) -> None:
    """high[b, u] = the verifier's sample from logp[b, k] for each (b, u, k), in one batched draw: the noise is
    keyed by (image, u), so the tokens are those of one draw per position. `outside` = (rejected [B, n] and
    draft [B, n] of the block starting at hi0, neighbours, k): a sampled rejection is drawn outside B_k(draft)."""
    if not picks:
        return
    b, u, k = (torch.tensor(c, device=high.device) for c in zip(*picks, strict=True))
    lp = logp[b, k]
    if outside is not None:
        rejected, draft, neighbours, k_pool = outside
        i = u - hi0
        hit = rejected[b, i]
        lp[hit] = outside_pool(lp[hit], draft[b[hit], i[hit]], neighbours, k_pool)
    high[b, u] = sample(lp[:, None], seed, ids[b], u[:, None])[:, 0]
