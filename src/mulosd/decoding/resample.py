"""Island resampling, step 6 of a MuLo-SD round: every position of R_X drawn again by the verifier, the islands
of each image side by side and the images of the batch in the same forwards.

Each step asks every position u the schedules (islands.IslandSchedule) have ready: one forward writes u's
predecessor (whose output is u's distribution) and the tokens drawn in the previous step. A row start whose
predecessor, the previous row's end, is still to be resampled (ZipAR within islands) is asked through a
provisional slot, as decode_zipar does: the previous row's latest final token written there, rewritten with
the real one once drawn (counted as `provisional_kv`). The first position of R_X, t0, needs no query: its
context is committed and unchanged, so the verification forward's distribution is exact. An image with nothing
to do in a step rewrites a position whose context is final (a no-op), so an image decodes the same alone and in
a batch.

Grown positions (expanded=reverify): the positions only grown into R_X keep their drafts in context and are
tested again once their context is final; a draft that passes stays, one that fails is resampled. Queries run
ahead of them: a position whose unfinished predecessors are all such drafts is asked in the same forward, and
its answer counts when every one of them stood (a run of drafts that pass resolves in one forward, as in
speculative decoding). The re-test draws its uniform from the verification test's key, so under sampled /
ratio acceptance a grown draft stays with probability min(first test's, re-test's), not their product. A
standing draft keeps the K/V its slot last got (the verification forward's, with rejected drafts in view,
unless a later query rewrote it); like the accepted positions after t0 it is exact again after the next
round's verification forward. `reverified` counts re-tests run, including answers that did not count.

Jacobi windows along island rows (resample_jacobi > 1, `JacobiDrafts`): every island position holds a draft
and an island row asks up to `window` of them per forward; each is tested as speculative sampling tests it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.backbone import padded_writes
from ..ar.noise import ISLAND_DRAFT, ISLAND_TEST, uniform
from ..ar.sampling import sample
from .acceptance import Pool, outside_pool, residual
from .islands import IslandSchedule
from .trace import Trace


@dataclass(frozen=True)
class Query:
    """A position asked in one forward: grid position `position` of batch row `image`, index `index` of island
    `island` of its schedule, answered by column `column` of the forward's output."""

    image: int
    position: int
    island: int
    index: int
    column: int


@dataclass
class Plan:
    """What image `image` writes in a forward: position -> token in the order written, the Jacobi drafts among
    them (position -> the group that alone sees it: its island row), and the queries the forward answers."""

    image: int
    writes: dict[int, int]
    groups: dict[int, int]
    queries: list[Query]


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


@dataclass(frozen=True)
class Draws:
    """How answers become tokens and verdicts: the verifier's noise keys (seed, image id, position), its warpers,
    the round's acceptance test `passes(logp, draft, images, positions) -> bool`, and where a sampled
    acceptance redraws (None under a threshold test; its `rejected` mask grows as grown drafts fail their
    re-test)."""

    seed: int
    ids: torch.Tensor
    warpers: Warpers
    passes: Callable
    redraw: Redraw | None = None

    def target(self, lp: torch.Tensor, b: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The distribution position u [m] of image b [m] is drawn from, given the verifier's lp [m, V] (a
        gathered copy: it is restricted in place)."""
        return lp if self.redraw is None else self.redraw.restrict(lp, b, u)

    def draw(self, high: torch.Tensor, logp: torch.Tensor, queries: list[Query], jacobi: JacobiDrafts | None = None
             ) -> None:
        """high[b, u] = the verifier's sample from logp[b, column] for each query, in one batched draw: the noise
        is keyed by (image, u), so the tokens are those of one draw per position. With `jacobi` the queries are
        Jacobi drafts that fell: each draws from norm(max(0, p - q)), q its draft's distribution."""
        if not queries:
            return
        b, u, k = _columns(queries, high.device)
        lp = self.target(logp[b, k], b, u)
        if jacobi is not None:
            lp = residual(lp, jacobi.logq[b, u - jacobi.start])
        high[b, u] = sample(lp[:, None], self.seed, self.ids[b], u[:, None])[:, 0]


def _columns(queries: list[Query], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries -> (images, positions, output columns), each [m]."""
    return tuple(torch.tensor(c, device=device) for c in zip(*((q.image, q.position, q.column) for q in queries),
                                                             strict=True))


@dataclass
class JacobiDrafts:
    """resample_jacobi > 1: Jacobi windows along island rows. Every island position after t0 (but reverify's
    grown ones, which hold the up-sampler's drafts) holds a draft and the log q it was drawn from: first the
    verification forward's answer, later the answer of a forward that asked it ahead of a draft that fell. An
    island row asks up to `window` positions per forward, its drafts written in a group of their own (the
    other rows do not see them; ZipAR's rule decides when a row may start, and a row start whose predecessor
    is still a draft goes through the provisional slot). Where a position's answer counts it is tested as
    speculative sampling tests it, min(1, p(x) / q(x)), and at a failure draws from norm(max(0, p - q)): the
    accepted prefix and one more token per row and forward, never fewer tokens than without the window. Under
    sampled acceptance p and q of a rejected position are restricted outside its draft's pool, as its direct
    resample would be. Noise: a position's drafts reuse its own draft noise (SJD's Gumbel coupling), its tests
    its own uniform, both on streams of their own; the residual draw is the verifier's."""

    logq: torch.Tensor  # [B, n, V] over the block
    start: int  # the block's first raster position
    window: int
    held: list[set[int]]  # per image: positions holding a Jacobi draft (the resampler's own sets)

    def draw(self, high: torch.Tensor, queries: list[Query], lp: torch.Tensor, draws: Draws) -> None:
        """New drafts at the queries' positions from the verifier's answers lp [m, V] (one row per query)."""
        if not queries:
            return
        b, u, _ = _columns(queries, high.device)
        q = draws.target(lp, b, u)
        self.logq[b, u - self.start] = q
        high[b, u] = sample(q[:, None], draws.seed, draws.ids[b], u[:, None], stream=ISLAND_DRAFT)[:, 0]
        for query in queries:
            self.held[query.image].add(query.position)

    def tests(self, high: torch.Tensor, out: torch.Tensor, plans: list[Plan], draws: Draws) -> set[tuple[int, int]]:
        """(image, position) of the asked drafts that pass speculative sampling's test under this forward."""
        checks = [q for plan in plans for q in plan.queries if q.position in self.held[q.image]]
        if not checks:
            return set()
        b, u, k = _columns(checks, high.device)
        x = high[b, u][:, None]
        p = draws.target(out[b, k], b, u)
        ratio = (p.gather(-1, x) - self.logq[b, u - self.start].gather(-1, x))[:, 0].exp()
        ok = (uniform(draws.seed, draws.ids[b], u, ISLAND_TEST) < ratio.clamp(max=1).double()).tolist()
        return {(q.image, q.position) for q, passed in zip(checks, ok, strict=True) if passed}


class IslandResampler:
    """Resamples one block's R_X for every image of the batch, in place in `high` [B, G*G]: `run(logp)` -> the
    sequential verifier forwards it took and the grown positions that kept their drafts ([B, n] over the
    block). `schedules`: one IslandSchedule per image (run() uses them up: one resampler per block);
    `grown` [B, n]: expanded=reverify's positions only grown into R_X (None: every position of R_X is redrawn);
    `window`: resample_jacobi."""

    def __init__(self, verifier: ARBackbone, high: torch.Tensor, start: int, size: int,
                 schedules: list[IslandSchedule], draws: Draws, trace: Trace, grown: torch.Tensor | None = None,
                 window: int = 1):
        self.verifier, self.high, self.start = verifier, high, start
        self.schedules, self.draws, self.trace, self.G = schedules, draws, trace, verifier.grid
        B = len(schedules)
        self.kept = torch.zeros(B, size, dtype=torch.bool, device=high.device)
        # positions holding a draft that may stand (a grown one, or a Jacobi draft)
        self.tentative = [set() if grown is None else set((start + torch.nonzero(grown[b])).flatten().tolist())
                          for b in range(B)]
        self.unwritten: list[set[int]] = [set() for _ in range(B)]  # drawn, not yet in the verifier's cache
        self.held: list[set[int]] = [set() for _ in range(B)]  # positions holding a Jacobi draft
        self.window, self.jacobi = window, None

    def run(self, logp: torch.Tensor) -> tuple[int, torch.Tensor]:
        """logp [B, n, V]: the verification forward's answers at the block's positions."""
        if self.window > 1:
            self.jacobi = JacobiDrafts(logp.clone(), self.start, self.window, self.held)
        self._first(logp)
        steps = 0
        while True:
            plans = [self._plan(b) for b in range(len(self.schedules))]
            if not any(plan.queries for plan in plans):
                return steps, self.kept
            out = self._forward(plans)
            steps += 1
            self._settle(plans, out)

    def _first(self, logp: torch.Tensor) -> None:
        """t0 of each image straight from the verification forward (islands are sorted by start; t0 was
        rejected itself); with Jacobi windows, every other island position's first draft too."""
        firsts = [Query(b, s.first, 0, 0, s.first - self.start) for b, s in enumerate(self.schedules)
                  if s.first is not None]
        self.draws.draw(self.high, logp, firsts)
        for q in firsts:
            self.unwritten[q.image].add(q.position)
            self.schedules[q.image].mark(0, 0)
        if self.jacobi is not None:
            picks = [Query(b, p, j, i, p - self.start) for b, s in enumerate(self.schedules)
                     for j, island in enumerate(s.islands) for i, p in enumerate(island)
                     if s.pending(j, p) and p not in self.tentative[b]]
            if picks:
                b, _, k = _columns(picks, self.high.device)
                self.jacobi.draw(self.high, picks, logp[b, k], self.draws)
                for q in picks:
                    self.tentative[q.image].add(q.position)

    def _plan(self, b: int) -> Plan:
        """Image b's writes and queries for the next forward: what it drew last, and the predecessor of every
        position its schedule has ready (the real token, or the provisional one of a row start)."""
        schedule, high, G, held = self.schedules[b], self.high, self.G, self.held[b]
        writes = {p: int(high[b, p]) for p in sorted(self.unwritten[b])}  # finished islands' last tokens too
        groups: dict[int, int] = {}
        ready = schedule.ready(self.tentative[b], None if self.jacobi is None else self.window)
        for u, j, _ in ready:
            if schedule.pending(j, u - 1) and (u - 1 not in self.tentative[b] or u - 1 in held and (u - 1) // G
                                               != u // G):  # a row start ahead of its predecessor
                latest = schedule.pending_in_row(j, (u - 1) // G)[0] - 1  # the previous row's last final token
                writes[u - 1] = int(high[b, latest])
                self.trace.count("provisional_kv", schedule.row_size(j, u // G) - 1)  # the row's others
            else:  # final, or a draft that may stand: its own token
                writes.setdefault(u - 1, int(high[b, u - 1]))
                if u - 1 in held:  # a Jacobi draft: seen by its own row only
                    groups[u - 1] = j * G + (u - 1) // G
        column = {p: c for c, p in enumerate(writes)}
        return Plan(b, writes, groups, [Query(b, u, j, i, column[u - 1]) for u, j, i in ready])

    def _forward(self, plans: list[Plan]) -> torch.Tensor:
        """One verifier forward over every image's writes -> its warped answers [B, width, V]. Short rows repeat
        their last write; an image with nothing to write rewrites a position whose token and context are final
        (it makes no more queries this round, so nothing it does here can change its image)."""
        idle = max(self.start - 1, 0)
        rows = [[(p, x, plan.groups.get(p, -1)) for p, x in plan.writes.items()]
                or [(idle, int(self.high[b, idle]), -1)] for b, plan in enumerate(plans)]
        pos, tok, group, real = padded_writes(rows, self.high.device)
        jacobi = any(plan.groups for plan in plans)
        return warp(self.verifier(pos, tok, group if jacobi else None, real), self.draws.warpers)

    def _settle(self, plans: list[Plan], out: torch.Tensor) -> None:
        """What this forward decided: each query whose blockers all stood is final, kept (a grown or Jacobi draft
        that passes) or drawn; a query asked ahead of a draft that fell asks again (a Jacobi draft is drafted
        again from this answer); Jacobi drafts that do not stand leave the cache."""
        stands = self._retest(plans, out)
        if self.jacobi is not None:
            stands |= self.jacobi.tests(self.high, out, plans, self.draws)
        outcome = Outcome()
        for plan in plans:
            self._walk(plan, stands, outcome)
        self.draws.draw(self.high, out, outcome.drawn)
        self.draws.draw(self.high, out, outcome.fell, self.jacobi)  # the noise a direct resample of it uses
        for q in outcome.fell:
            self.held[q.image].discard(q.position)
        if outcome.redrafts:
            b, _, k = _columns(outcome.redrafts, self.high.device)
            self.jacobi.draw(self.high, outcome.redrafts, out[b, k], self.draws)
        if outcome.dropped:
            mask = torch.zeros_like(self.high, dtype=torch.bool)
            mask[tuple(torch.tensor(c, device=self.high.device) for c in zip(*outcome.dropped, strict=True))] = True
            self.verifier.forget_mask(mask)
        for q in outcome.drawn + outcome.fell:
            self.unwritten[q.image].add(q.position)

    def _walk(self, plan: Plan, stands: set[tuple[int, int]], outcome: Outcome) -> None:
        """One image's queries in schedule order: which are decided by this forward, and how."""
        b = plan.image
        schedule, held, tentative = self.schedules[b], self.held[b], self.tentative[b]
        stood: set[int] = set()  # decided in this step with the token that was in context
        decided = []  # marked done after the walk: `done` stays what it was when this forward was asked
        for q in plan.queries:
            island = schedule.islands[q.island]
            if not all(schedule.done[q.island][m] or island[m] in stood for m in schedule.blockers[q.island][q.index]):
                if q.position in held:  # asked ahead of a draft that fell: drafted again from this answer
                    outcome.redrafts.append(q)
                continue  # asked ahead of a draft that did not stand: ask again
            decided.append(q)
            if q.position in held:
                self.trace.count("jacobi_tested", 1)
            if (b, q.position) in stands:
                stood.add(q.position)
                if q.position in held:
                    self.trace.count("jacobi_kept", 1)
                else:
                    self.kept[b, q.position - self.start] = True
            else:
                redraw = self.draws.redraw
                if q.position in tentative and redraw is not None and q.position not in held:
                    redraw.rejected[b, q.position - self.start] = True  # failed its re-test: redrawn outside its pool
                (outcome.fell if q.position in held else outcome.drawn).append(q)
            tentative.discard(q.position)
        for q in decided:
            schedule.mark(q.island, q.index)
        self.unwritten[b].difference_update(plan.writes)
        # a Jacobi draft stands in the cache where it was written this time; else it is written next time
        self.unwritten[b].update(u for u in stood & held if u not in plan.writes)
        outcome.dropped += [(b, p) for p in plan.groups if p not in stood]
        held.difference_update(stood)

    def _retest(self, plans: list[Plan], out: torch.Tensor) -> set[tuple[int, int]]:
        """(image, position) of the asked grown drafts (tentative, not Jacobi drafts) that pass the acceptance
        test under this forward's answers (whether those answers count is `_walk`'s business), in one batched
        test."""
        checks = [q for plan in plans for q in plan.queries
                  if q.position in self.tentative[q.image] and q.position not in self.held[q.image]]
        if not checks:
            return set()
        b, u, k = _columns(checks, self.high.device)
        ok = self.draws.passes(out[b, k], self.high[b, u], b, u).tolist()
        self.trace.count("reverified", len(checks))
        return {(q.image, q.position) for q, passed in zip(checks, ok, strict=True) if passed}


@dataclass
class Outcome:
    """A forward's decisions over the batch: queries to draw from p, Jacobi drafts that fell (residual draws),
    queries asked ahead of a fallen draft that hold Jacobi drafts (drafted again), and (image, position) of the
    Jacobi drafts written this time that do not stand (they leave the cache)."""

    drawn: list[Query] = field(default_factory=list)
    fell: list[Query] = field(default_factory=list)
    redrafts: list[Query] = field(default_factory=list)
    dropped: list[tuple[int, int]] = field(default_factory=list)
