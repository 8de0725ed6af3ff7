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
   (`rejection=raster` takes every position from t0 on); `expanded=reverify` keeps the drafts of the positions
   only grown into R_X where they pass the test again in their resampled context (see `_resample`);
6. R_X splits into islands (8-connected, see islands.py) resampled concurrently, one query per island per
   step (`resample=parallel`), ZipAR within islands (`zipar`: an island's rows advance together, window
   `resample_window`), or one island after another (`serial`); `resample_jacobi` > 1 lets each island row test
   that many positions per forward as speculative Jacobi decoding does (`_IslandDrafts`);
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

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, DRAFT, ISLAND_DRAFT, ISLAND_TEST, uniform
from ..ar.sampling import sample
from .acceptance import outside_pool, pooled_accept, pooled_mass, residual, sampled_accept
from .islands import IslandSchedule, expand, first_rejected
from .knobs import MuLoSDConfig
from .trace import Round, Trace
from .zipar import zipar_rows


@dataclass(frozen=True)
class Pool:
    """B_k(x): a code x and its k nearest codes (rows of the tokenizer's neighbour table [V, >= k])."""

    neighbours: torch.Tensor
    k: int

    def mass(self, logp: torch.Tensor, x: torch.Tensor, delta: float | None = None) -> torch.Tensor:
        return pooled_mass(logp, x, self.neighbours, self.k, delta)


@dataclass(frozen=True)
class Block:
    """Round k's rows: low-res raster positions [lo0, lo1), and the high-res ones [hi0, hi1) they up-sample to."""

    k: int
    lo0: int
    lo1: int
    hi0: int
    hi1: int

    @property
    def size(self) -> int:
        return self.hi1 - self.hi0


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of a block's draft, each [B, n] bool over the block's high-res positions."""

    accepted: torch.Tensor  # passed the acceptance test
    redo: torch.Tensor  # R_X: the rejected ones grown by the radius, never before t0; resampled (expanded=reverify:
    # the grown ones only where their re-test fails)
    stale: torch.Tensor  # accepted after t0: their K/V were computed with rejected drafts in context

    @property
    def rejected(self) -> torch.Tensor:
        return ~self.accepted


@dataclass(frozen=True)
class Redraw:
    """Where a sampled acceptance redraws: a rejected position outside its draft's pool, as is a grown one whose
    re-test failed (expanded=reverify); positions only grown into R_X and resampled draw from p."""

    rejected: torch.Tensor  # [B, n] over the block starting at raster position `start`
    draft: torch.Tensor  # [B, n]
    pool: Pool
    start: int

    def restrict(self, logp: torch.Tensor, b: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """logp [m, V] of images b [m] at positions u [m], with B_k(draft) removed where u was rejected."""
        i = u - self.start
        hit = self.rejected[b, i]
        logp[hit] = outside_pool(logp[hit], self.draft[b[hit], i[hit]], self.pool.neighbours, self.pool.k)
        return logp


def draft_warpers(warpers: Warpers, cfg: MuLoSDConfig) -> Warpers:
    """How the drafter draws: the verifier's warpers at `draft_temperature` where set."""
    t = cfg.draft_temperature
    return warpers if t is None else replace(warpers, temperature=t)


def parents(G: int, g: int, device=None) -> torch.Tensor:
    """[G*G]: each high-res raster position's parent on the low-res g x g grid (U_r maps a low-res token to an
    r x r patch)."""
    p, r = torch.arange(G * G, device=device), G // g
    return (p // G // r) * g + (p % G) // r


# the critical path by phase: steps = 1 (the two prefix forwards) + these
PHASES = ("draft_steps", "verify_steps", "resample_steps")
TALLIES = ("drafted", "accepted", "resampled", "reverified", "stale_kv", "refreshed", "up_calls", "down_calls",
           "provisional_kv", *PHASES)
JACOBI_TALLIES = ("jacobi_tested", "jacobi_kept")  # kept only with resample_jacobi > 1


@torch.no_grad()
def decode_mulosd(verifier: ARBackbone, drafter: ARBackbone, up: Callable, down: Callable, captions: list[str],
                  neighbours: torch.Tensor, cfg: MuLoSDConfig = MuLoSDConfig(), seed: int = 0,
                  warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
                  progress=None, accept: Callable | None = None, rounds: bool = False) -> tuple[torch.Tensor, Trace]:
    """-> high-res tokens [B, G, G] and the trace. `up(tokens_low [B,h,w]) -> [B,rh,rw]`, `down` the reverse.
    `accept(logp [..., V], draft [...]) -> bool [...]` replaces pooled acceptance (the GPU cost model forces
    acceptance rates with it); it gets a block [B, n] from the verification forward and, with
    expanded=reverify, a flat batch [m] of re-tests. `rounds`: keep every round's masks and drafts in the trace
    (for pictures)."""
    run = _MuLoSD(verifier, drafter, up, down, len(captions), Pool(neighbours, cfg.pool_k), cfg, seed,
                  warpers or Warpers(), image_ids, accept)
    B = len(captions)
    run.trace = trace = Trace("mulosd", keep_rounds=rounds, images=B, tokens=B * verifier.grid ** 2).start(
        *TALLIES, *(JACOBI_TALLIES if cfg.resample_jacobi > 1 else ()), verifier=verifier, drafter=drafter)
    run.begin(captions)
    for block in run.blocks():
        run.draft(block)  # 1
        draft = run.upsample(block)  # 2
        logp = run.verify(block, draft)  # 3
        verdict = run.judge(block, draft, logp)  # 4-5
        run.resample(block, draft, logp, verdict)  # 6
        run.commit(block)  # 7
        if progress is not None:
            progress.update(1)
    trace.steps = 1 + sum(trace.counts[k] for k in PHASES)
    return run.high.view(run.B, run.G, run.G), trace.stop()


class _MuLoSD:
    """One MuLo-SD run: the two grids being decoded and the caches' bookkeeping; a method per step of a round."""

    trace: Trace

    def __init__(self, verifier: ARBackbone, drafter: ARBackbone, up: Callable, down: Callable, B: int, pool: Pool,
                 cfg: MuLoSDConfig, seed: int, warpers: Warpers, image_ids: torch.Tensor | None,
                 accept: Callable | None):
        G, g = verifier.grid, drafter.grid
        if G % g:
            raise ValueError(f"verifier grid {G} is not a multiple of the drafter grid {g}")
        cfg = replace(cfg, draft_rows=min(cfg.draft_rows, g))  # more rows than the grid has: the whole grid
        if g % cfg.draft_rows:
            raise ValueError(f"draft_rows={cfg.draft_rows} must divide the drafter's {g} rows")
        self.verifier, self.drafter, self.up, self.down, self.pool, self.cfg = verifier, drafter, up, down, pool, cfg
        self.B, self.G, self.g, self.r = B, G, g, G // g
        self.seed, self.warpers, self.accept = seed, warpers, accept
        # the drafter proposes and only the verifier's test decides what stays, so it may draw colder than the
        # verifier samples (what that buys and costs: docs/log.md)
        self.draft_warpers = draft_warpers(warpers, cfg)
        self.sampled = cfg.acceptance in ("sampled", "ratio") and accept is None  # a draw, not a threshold
        device = self.device = verifier.device
        self.ids = (torch.arange(B) if image_ids is None else image_ids).to(device)
        self.low = torch.zeros(B, g * g, dtype=torch.long, device=device)
        self.high = torch.zeros(B, G * G, dtype=torch.long, device=device)
        # acceptance=ratio: the drafter's pooled mass of each low-res token it drew
        self.q_mass = torch.ones(B, g * g, device=device) if cfg.acceptance == "ratio" else None
        self.parent = parents(G, g, device)
        self.unwritten: list[list[int]] = [[] for _ in range(B)]  # per image: sampled last round, not in the cache
        self.drafted: tuple[torch.Tensor, torch.Tensor] | None = None  # (low, high) grids as drafted, for Round

    def blocks(self):
        d, g, G, r = self.cfg.draft_rows, self.g, self.G, self.r
        for k in range(g // d):
            yield Block(k, k * d * g, (k + 1) * d * g, k * r * d * G, (k + 1) * r * d * G)

    def begin(self, captions: list[str]) -> None:
        self.next_low = self.drafter.start(captions)  # the drafter's logits for the next low-res position
        self.first_high = self.verifier.start(captions)  # the verifier's for position 0
        # the two prefix forwards are independent: one step on the critical path (decode_mulosd adds it)

    def draft(self, block: Block) -> None:
        """1. The drafter drafts the block's low-res rows, after writing the previous block's down-sampled
        committed tokens into its cache in one forward."""
        cfg = self.cfg
        if block.k > 0:
            prev = torch.arange(2 * block.lo0 - block.lo1, block.lo0, device=self.device).expand(self.B, -1)
            self.next_low = self.drafter(prev, self.low.gather(1, prev))[:, -1:]
            self.trace.count("draft_steps", 1)
        window = self.g if cfg.draft == "serial" else cfg.draft_window  # a full-row window is serial drafting

        def draw(logits, pos):  # the drafter's own draw, on its own noise stream
            logq = warp(logits, self.draft_warpers)
            x = sample(logq, self.seed, self.ids, pos, stream=DRAFT)
            if self.q_mass is not None:
                self.q_mass.scatter_(1, pos, self.pool.mass(logq, x).to(self.q_mass.dtype))
            return x

        self.trace.count("draft_steps", zipar_rows(self.drafter, self.low, block.k * cfg.draft_rows, cfg.draft_rows,
                                                   window, self.next_low, draw, self.trace))

    def upsample(self, block: Block) -> torch.Tensor:
        """2. U_r up-samples the low-res prefix; it is row-causal, so only this block's rows are new."""
        B, g = self.B, self.g
        self.trace.count("up_calls", 1)
        return self.up(self.low[:, :block.lo1].view(B, block.lo1 // g, g)).reshape(B, -1)[:, block.hi0:block.hi1]

    def verify(self, block: Block, draft: torch.Tensor) -> torch.Tensor:
        """3. The verifier checks the draft in one forward -> its warped log-probabilities [B, n, V] at the
        block's positions. The forward also rewrites the committed previous block (stale-KV refresh), or with
        kv_refresh=none only what the previous round sampled last and never wrote."""
        B, device, hi0, n = self.B, self.device, block.hi0, block.size
        if block.k == 0:
            committed = torch.empty(B, 0, dtype=torch.long, device=device)
        elif self.cfg.kv_refresh == "none":  # the block's last position too: its output is the new block's first
            committed = torch.cat([_padded(self.unwritten, hi0 - 1, device),
                                   torch.full((B, 1), hi0 - 1, device=device)], 1)
        else:
            committed = torch.arange(hi0 - n, hi0, device=device).expand(B, -1)
            self.trace.count("refreshed", B * n)
        positions = torch.cat([committed, torch.arange(hi0, block.hi1 - 1, device=device).expand(B, -1)], dim=1)
        out = self.verifier(positions, torch.cat([self.high.gather(1, committed), draft[:, :-1]], dim=1))
        self.trace.count("verify_steps", 1)
        self.high[:, hi0:block.hi1] = draft
        if self.trace.keep_rounds:
            self.drafted = self.low.cpu().clone(), self.high.cpu().clone()
        return warp(out[:, -n:] if block.k > 0 else torch.cat([self.first_high, out], dim=1), self.warpers)

    def judge(self, block: Block, draft: torch.Tensor, logp: torch.Tensor) -> Verdict:
        """4-5. Pooled acceptance, then local rejection: the rejected positions grown by the radius from t0 on."""
        cfg, B, G = self.cfg, self.B, self.G
        images = torch.arange(B, device=self.device)[:, None].expand(-1, block.size)
        positions = torch.arange(block.hi0, block.hi1, device=self.device).expand(B, -1)
        accepted = self.passes(logp, draft, images, positions)
        rows = block.size // G
        redo = expand((~accepted).view(B, rows, G), cfg.radius, cfg.rejection).reshape(B, -1)
        t0 = first_rejected(redo.view(B, rows, G))
        stale = ~redo & (torch.arange(block.size, device=self.device)[None] > t0[:, None])
        return Verdict(accepted, redo, stale)

    def passes(self, logp: torch.Tensor, draft: torch.Tensor, b: torch.Tensor, positions: torch.Tensor
               ) -> torch.Tensor:
        """The acceptance test of drafts at grid positions of batch rows b (each [...]) under logp [..., V]."""
        cfg, pool = self.cfg, self.pool
        if self.accept is not None:
            return self.accept(logp, draft)
        if self.sampled:
            u = uniform(self.seed, self.ids[b].flatten(), positions.flatten(), ACCEPT).view(positions.shape)
            q = None if self.q_mass is None else self.q_mass[b, self.parent[positions]]
            return sampled_accept(logp, draft, pool.neighbours, pool.k, cfg.tau, u, cfg.delta, q)
        return pooled_accept(logp, draft, pool.neighbours, pool.k, cfg.tau, cfg.delta, cfg.relative)

    def resample(self, block: Block, draft: torch.Tensor, logp: torch.Tensor, verdict: Verdict) -> None:
        """6. R_X splits into islands, resampled concurrently by the verifier (or one after another)."""
        cfg, trace, G, hi0, redo = self.cfg, self.trace, self.G, block.hi0, verdict.redo
        # expanded=reverify: the grown positions keep their drafts in context until re-tested (with the K/V the
        # verification forward wrote, see _resample)
        grown = redo & verdict.accepted if cfg.expanded == "reverify" else None
        if not cfg.keep_rejected:  # rejected drafts leave the verifier's context
            self.verifier.forget_mask(_on_grid(redo if grown is None else redo & ~grown, hi0, G * G))
        trace.count("stale_kv", verdict.stale.sum())
        schedules = [IslandSchedule.of(redo[b], hi0, G, cfg.resample, cfg.resample_window) for b in range(self.B)]
        rejected = verdict.rejected.clone()  # grown positions whose re-test fails join it (they redraw outside B_k)
        redraw = Redraw(rejected, draft, self.pool, hi0) if self.sampled else None
        jacobi = _IslandDrafts(logp, hi0, cfg.resample_jacobi) if cfg.resample_jacobi > 1 else None
        steps, kept = _resample(self.verifier, self.high, schedules, block, logp, self,
                                verdict.stale if cfg.kv_refresh == "eager" else None, redraw, grown, jacobi)
        redo = redo & ~kept
        trace.count("resample_steps", steps)
        trace.count("drafted", self.B * block.size)
        trace.count("accepted", (~redo).sum())
        trace.count("resampled", redo.sum())
        trace.round(lambda: Round(*(_on_grid(m, hi0, G * G).cpu() for m in
                                    (torch.ones_like(redo), ~redo, verdict.rejected, redo)),
                                  low_draft=self.drafted[0], high_draft=self.drafted[1]))

    def commit(self, block: Block) -> None:
        """7. D_r down-samples the committed rows for the drafter's next round."""
        if block.k + 1 < self.g // self.cfg.draft_rows:
            B, G = self.B, self.G
            self.low[:, block.lo0:block.lo1] = self.down(
                self.high[:, :block.hi1].view(B, block.hi1 // G, G)).reshape(B, -1)[:, block.lo0:block.lo1]
            self.trace.count("down_calls", 1)


def _on_grid(block_mask: torch.Tensor, start: int, n: int) -> torch.Tensor:
    """A block's mask [B, m] placed at raster offset `start` on the whole grid [B, n]."""
    out = torch.zeros(block_mask.shape[0], n, dtype=torch.bool, device=block_mask.device)
    out[:, start:start + block_mask.shape[1]] = block_mask
    return out


class _IslandDrafts:
    """resample_jacobi > 1: Jacobi windows along island rows. Every island position after t0 (but reverify's
    grown ones, which hold the up-sampler's drafts) holds a draft and the log q it was drawn from: first the
    verification forward's answer, later the answer of a forward that asked it ahead of a draft that fell. An
    island row asks up to `window` positions per forward, its drafts written in a group of their own (the
    other rows do not see them; ZipAR's rule decides when a row may start, and a row start whose predecessor
    is still a draft goes through the provisional slot as in `zipar`). Where a position's answer counts it is
    tested as speculative sampling tests it, min(1, p(x) / q(x)), and at a failure draws from
    norm(max(0, p - q)): the accepted prefix and one more token per row and forward, never fewer tokens than
    without the window. Under sampled acceptance p and q of a rejected position are restricted outside its
    draft's pool, as its direct resample would be. Noise: a position's drafts reuse its own draft noise (SJD's
    Gumbel coupling), its tests its own uniform, both on streams of their own (its test decides its token once:
    only when every position before it in its row stands); the residual draw is the verifier's."""

    def __init__(self, logp: torch.Tensor, hi0: int, window: int):
        self.logq, self.hi0, self.window = logp.clone(), hi0, window  # [B, n, V]
        self.held: list[set[int]] = [set() for _ in range(logp.shape[0])]

    def target(self, lp: torch.Tensor, b: torch.Tensor, u: torch.Tensor, redraw: Redraw | None) -> torch.Tensor:
        """The distribution position u [m] of image b [m] is sampled from, given the verifier's lp [m, V] (a
        gathered copy: it is restricted in place)."""
        return lp if redraw is None else redraw.restrict(lp, b, u)

    def draw(self, high: torch.Tensor, picks: list[tuple[int, int]], lp: torch.Tensor, run: _MuLoSD,
             redraw: Redraw | None) -> None:
        """New drafts at (image, position) `picks` from the verifier's answers lp [m, V]."""
        if not picks:
            return
        b, u = (torch.tensor(c, device=high.device) for c in zip(*picks, strict=True))
        q = self.target(lp, b, u, redraw)
        self.logq[b, u - self.hi0] = q
        high[b, u] = sample(q[:, None], run.seed, run.ids[b], u[:, None], stream=ISLAND_DRAFT)[:, 0]
        for bb, uu in picks:
            self.held[bb].add(uu)

    def fill(self, high: torch.Tensor, schedules: list[IslandSchedule], logp: torch.Tensor,
             tentative: list[set[int]], run: _MuLoSD, redraw: Redraw | None) -> None:
        """Every island position still to do and not holding a grown draft gets one from the verification."""
        picks = [(b, p) for b, s in enumerate(schedules) for j, island in enumerate(s.islands) for p in island
                 if s.pending(j, p) and p not in tentative[b]]
        if picks:
            b, u = (torch.tensor(c, device=high.device) for c in zip(*picks, strict=True))
            self.draw(high, picks, logp[b, u - self.hi0], run, redraw)
            for bb, uu in picks:
                tentative[bb].add(uu)

    def tests(self, high: torch.Tensor, out: torch.Tensor, targets: list, run: _MuLoSD, redraw: Redraw | None
              ) -> set[tuple[int, int]]:
        """(image, position) of the asked drafts that pass speculative sampling's test under this forward."""
        checks = [(b, u, k) for b, t in enumerate(targets) for u, _, _, k in t if u in self.held[b]]
        if not checks:
            return set()
        b, u, k = (torch.tensor(c, device=high.device) for c in zip(*checks, strict=True))
        x = high[b, u][:, None]
        p = self.target(out[b, k], b, u, redraw)
        ratio = (p.gather(-1, x) - self.logq[b, u - self.hi0].gather(-1, x))[:, 0].exp()
        ok = (uniform(run.seed, run.ids[b], u, ISLAND_TEST) < ratio.clamp(max=1).double()).tolist()
        return {(bb, uu) for (bb, uu, _), passed in zip(checks, ok, strict=True) if passed}


def _resample(verifier: ARBackbone, high: torch.Tensor, schedules: list[IslandSchedule], block: Block,
              logp: torch.Tensor, run: _MuLoSD, refresh: torch.Tensor | None, redraw: Redraw | None,
              grown: torch.Tensor | None = None, jacobi: _IslandDrafts | None = None) -> tuple[int, torch.Tensor]:
    """Resample every island position of `schedules` (one per image) in place in `high`; returns the number of
    sequential verifier forwards and the grown positions that kept their drafts ([B, n] over the block), and
    leaves in `run.unwritten`, per image, the positions sampled but not yet written (the last step's samples:
    the next verification forward writes them). `refresh` [B, n]: the accepted positions after t0 to rewrite
    once their context is final (kv_refresh=eager), or None.

    Each step queries every position u the schedules have ready: one forward writes u's predecessor (whose
    output is u's distribution) and the tokens sampled in the previous step. A row start whose predecessor,
    the previous row's end, is still to be resampled (ZipAR within islands) is queried through a provisional
    slot, as decode_zipar does: the previous row's latest final token written there, rewritten with the real
    one once sampled (counted as `provisional_kv`). The first position of R_X, t0, needs no query: its context
    is committed and unchanged, so the verification forward's distribution is exact. An image with nothing to
    do in a step rewrites a position whose context is final (a no-op), so an image decodes the same alone and
    in a batch.

    `grown` [B, n] (expanded=reverify): the positions of R_X that were only grown into it. Each keeps its draft
    where the draft passes the acceptance test again once its context is final, and is resampled otherwise.
    Their drafts stay in context meanwhile, so the queries run ahead of them: a position whose unfinished
    predecessors in the schedule are all such drafts is queried in the same forward, and its answer counts
    when every one of them stood (a run of drafts that pass resolves in one forward, as in speculative
    decoding; one that fails makes the positions after it ask again in the next forward). The re-test draws
    its uniform from the same key as the verification test, so under sampled / ratio acceptance a grown draft
    stays with probability min(first test's, re-test's) rather than their product. A draft that stands keeps
    the K/V of the forward that last wrote its slot: the verification forward's (rejected drafts in view) unless
    a later query rewrote it as its predecessor; like the accepted positions after t0 it is exact again only
    after the next round's verification forward (kv_refresh=round), not counted in `stale_kv`. `reverified`
    counts re-tests run, including answers that did not count.

    `jacobi` (resample_jacobi > 1): the island positions hold Jacobi drafts, asked and tested a window per row
    (`_IslandDrafts`); drafts not standing after a forward leave the cache."""
    B, G, hi0 = len(schedules), verifier.grid, block.hi0
    kept = torch.zeros(B, block.size, dtype=torch.bool, device=high.device)
    tentative = [set() if grown is None else set((hi0 + torch.nonzero(grown[b])).flatten().tolist())
                 for b in range(B)]
    unwritten: list[set[int]] = [set() for _ in range(B)]
    # t0 first, straight from the verification forward (islands are sorted by start; t0 was rejected itself)
    firsts = [(b, s.first) for b, s in enumerate(schedules) if s.first is not None]
    _sample_at(high, logp, [(b, t0, t0 - hi0) for b, t0 in firsts], run, redraw)
    for b, t0 in firsts:
        unwritten[b].add(t0)
        schedules[b].mark(0, 0)
    held = [set() for _ in range(B)] if jacobi is None else jacobi.held
    if jacobi is not None:
        jacobi.fill(high, schedules, logp, tentative, run, redraw)
    window = None if jacobi is None else jacobi.window
    # eager refresh: accepted positions after t0 hold K/V computed with rejected drafts in view; each is rewritten
    # in the first forward after every position before it is final (no extra forward: the ones that become
    # final only with the round's last samples are rewritten by the next round's verification forward)
    stale = [[] if refresh is None else (hi0 + torch.nonzero(refresh[b])).flatten().tolist() for b in range(B)]
    steps = 0
    while True:
        writes, targets = [], []  # per image: [(position, token)], [(u, island, index, index of u-1 in writes)]
        groups: list[dict[int, int]] = []  # per image: position -> group of a Jacobi draft written
        for b, schedule in enumerate(schedules):
            groups.append({})
            w = {p: int(high[b, p]) for p in sorted(unwritten[b])}  # finished islands' last tokens too
            if stale[b]:
                undone = schedule.first_pending(block.hi1)
                final = [p for p in stale[b] if p < undone]
                w |= {p: int(high[b, p]) for p in final}
                run.trace.count("refreshed", len(final))
                stale[b] = stale[b][len(final):]
            ready = schedule.ready(tentative[b], window)
            for u, j, _ in ready:
                if schedule.pending(j, u - 1) and (u - 1 not in tentative[b] or u - 1 in held[b] and (u - 1) // G
                                                   != u // G):  # a row start ahead of its predecessor
                    latest = schedule.pending_in_row(j, (u - 1) // G)[0] - 1  # the previous row's last final token
                    w[u - 1] = int(high[b, latest])
                    run.trace.count("provisional_kv", schedule.row_size(j, u // G) - 1)  # the row's others
                else:  # final, or a draft that may stand: its own token
                    w.setdefault(u - 1, int(high[b, u - 1]))
                    if u - 1 in held[b]:  # a Jacobi draft: seen by its own row only
                        groups[b][u - 1] = j * G + (u - 1) // G
            writes.append(list(w.items()))
            targets.append([(u, j, i, list(w).index(u - 1)) for u, j, i in ready])
        if not any(targets):
            run.unwritten = [sorted(w) for w in unwritten]
            return steps, kept
        width = max(len(w) for w in writes)
        pos = torch.empty(B, width, dtype=torch.long, device=high.device)
        tok, group = torch.empty_like(pos), torch.full_like(pos, -1)
        for b, w in enumerate(writes):
            # pad by repeating the last write; a finished image rewrites a position whose token and context
            # are final (it makes no more queries this round, so nothing it does here can change its image)
            w = w or [(max(hi0 - 1, 0), int(high[b, max(hi0 - 1, 0)]))]
            w = w + [w[-1]] * (width - len(w))
            pos[b], tok[b] = torch.tensor([p for p, _ in w]), torch.tensor([x for _, x in w])
            group[b] = torch.tensor([groups[b].get(p, -1) for p, _ in w])
        out = warp(verifier(pos, tok, group if any(groups) else None), run.warpers)
        steps += 1
        stands = _retest(high, out, targets, tentative, run, held)
        if jacobi is not None:
            stands |= jacobi.tests(high, out, targets, run, redraw)
        picks, failed, redrafts, dropped = [], [], [], []  # failed: Jacobi drafts that fell (residual draws)
        for b, schedule in enumerate(schedules):
            stood: set[int] = set()  # decided in this step with the token that was in context
            decided = []  # marked done after the walk: `done` stays what it was when this forward was asked
            written = {p for p, _ in writes[b]}
            for u, j, i, k in targets[b]:
                island = schedule.islands[j]
                if not all(schedule.done[j][m] or island[m] in stood for m in schedule.blockers[j][i]):
                    if u in held[b]:  # asked ahead of a draft that fell: drafted again from this answer
                        redrafts.append((b, u, k))
                    continue  # asked ahead of a draft that did not stand: ask again
                decided.append((j, i))
                if u in held[b]:
                    run.trace.count("jacobi_tested", 1)
                if (b, u) in stands:
                    stood.add(u)
                    if u in held[b]:
                        run.trace.count("jacobi_kept", 1)
                    else:
                        kept[b, u - hi0] = True
                else:
                    if u in tentative[b] and redraw is not None and u not in held[b]:
                        redraw.rejected[b, u - hi0] = True  # failed its re-test: redrawn outside its draft's pool
                    (failed if u in held[b] else picks).append((b, u, k))
                tentative[b].discard(u)
            for j, i in decided:
                schedule.mark(j, i)
            unwritten[b].difference_update(written)
            # a Jacobi draft stands in the cache where it was written this time; else it is written next time
            unwritten[b].update(u for u in stood & held[b] if u not in written)
            dropped += [(b, p) for p in groups[b] if p not in stood]
            held[b].difference_update(stood)
        _sample_at(high, out, picks, run, redraw)
        _sample_at(high, out, failed, run, redraw, jacobi)  # the noise a direct resample of the position uses
        for bb, uu, _ in failed:
            held[bb].discard(uu)
        if redrafts:
            b, _, k = (torch.tensor(c, device=high.device) for c in zip(*redrafts, strict=True))
            jacobi.draw(high, [(bb, uu) for bb, uu, _ in redrafts], out[b, k], run, redraw)
        if dropped:  # Jacobi drafts written this time that do not stand leave the cache
            mask = torch.zeros(B, G * G, dtype=torch.bool, device=high.device)
            mask[tuple(torch.tensor(c, device=high.device) for c in zip(*dropped, strict=True))] = True
            verifier.forget_mask(mask)
        for b, u, _ in picks + failed:
            unwritten[b].add(u)


def _retest(high: torch.Tensor, out: torch.Tensor, targets: list, tentative: list[set[int]], run: _MuLoSD,
            jacobi: list[set[int]]) -> set[tuple[int, int]]:
    """(image, position) of the queried grown drafts (tentative, not Jacobi drafts) that pass the acceptance
    test under this forward's answers (whether those answers count is the caller's business), in one batched
    test."""
    checks = [(b, u, k) for b, t in enumerate(targets) for u, _, _, k in t if u in tentative[b] and u not in jacobi[b]]
    if not checks:
        return set()
    b, u, k = (torch.tensor(c, device=high.device) for c in zip(*checks, strict=True))
    ok = run.passes(out[b, k], high[b, u], b, u).tolist()
    run.trace.count("reverified", len(checks))
    return {(bb, uu) for (bb, uu, _), passed in zip(checks, ok, strict=True) if passed}


def _padded(rows: list[list[int]], fill: int, device) -> torch.Tensor:
    """Per-image position lists -> [B, longest], short rows padded with `fill` (a position the forward writes
    anyway: a duplicate write of one slot in one forward computes the same K/V twice)."""
    width = max(map(len, rows), default=0)
    return torch.tensor([row + [fill] * (width - len(row)) for row in rows], dtype=torch.long,
                        device=device).view(len(rows), width)


def _sample_at(high: torch.Tensor, logp: torch.Tensor, picks: list[tuple[int, int, int]], run: _MuLoSD,
               redraw: Redraw | None, jacobi: _IslandDrafts | None = None) -> None:
    """high[b, u] = the verifier's sample from logp[b, k] for each (b, u, k), in one batched draw: the noise is
    keyed by (image, u), so the tokens are those of one draw per position. With `jacobi` the picks are Jacobi
    drafts that fell: each draws from norm(max(0, p - q)), q its draft's distribution."""
    if not picks:
        return
    b, u, k = (torch.tensor(c, device=high.device) for c in zip(*picks, strict=True))
    lp = logp[b, k]
    if redraw is not None:
        lp = redraw.restrict(lp, b, u)
    if jacobi is not None:
        lp = residual(lp, jacobi.logq[b, u - jacobi.hi0])
    high[b, u] = sample(lp[:, None], run.seed, run.ids[b], u[:, None])[:, 0]
