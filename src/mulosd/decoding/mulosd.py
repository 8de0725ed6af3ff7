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
   only grown into R_X where they pass the test again in their resampled context (resample.py);
6. R_X splits into islands (8-connected, see islands.py) resampled concurrently by the verifier
   (resample.py): one query per island per step (`resample=parallel`), ZipAR within islands (`zipar`: an
   island's rows advance together, window `resample_window`), or one island after another (`serial`);
   `resample_jacobi` > 1 lets each island row test that many positions per forward as speculative Jacobi
   decoding does;
7. the committed block is down-sampled by D_r for M_q's next round.

Stale KV entries. The verification forward writes K/V for every drafted position; those of accepted positions
after t0 were computed with rejected drafts in their context. Rejected positions leave the verifier's context
at once; accepted ones after t0 are counted as `stale_kv` and stay until the next round's verification forward,
which rewrites the whole committed previous block together with the new draft, in the same single forward, so
every later round sees exact entries (the rewrites counted as `refreshed`). The drafter's cache is exact: it
re-reads the down-sampled committed block.

Randomness: the verifier samples position p with the same key AR uses, (seed, image, p); the drafter draws
with its own stream. Hence `tau > 1` with serial resampling reproduces `ar` token for token, and `tau = 0`
returns the up-sampled draft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import Pool, pooled_accept, sampled_accept
from .islands import IslandSchedule, expand, first_rejected
from .knobs import MuLoSDConfig
from .resample import Draws, IslandResampler, Redraw
from .trace import Round, Trace
from .zipar import zipar_rows

# the interface of this module: the decoder, and what a report needs to reproduce a part of it
__all__ = ["PHASES", "decode_mulosd", "draft_warpers", "parents"]


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
class Acceptance:
    """The verifier's judgement of a block's draft, each [B, n] bool over the block's high-res positions."""

    accepted: torch.Tensor  # passed the acceptance test
    redo: torch.Tensor  # R_X: the rejected ones grown by the radius, never before t0; resampled (expanded=reverify:
    # the grown ones only where their re-test fails)
    stale: torch.Tensor  # accepted after t0: their K/V were computed with rejected drafts in context

    @property
    def rejected(self) -> torch.Tensor:
        return ~self.accepted


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
        acceptance = run.check(block, draft, logp)  # 4-5
        run.resample(block, draft, logp, acceptance)  # 6
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
        cfg = replace(cfg, draft_rows=cfg.rows_per_round(g))
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
        block's positions. The forward also rewrites the committed previous block (stale-KV refresh)."""
        B, device, hi0, n = self.B, self.device, block.hi0, block.size
        committed = torch.arange(hi0 - n if block.k > 0 else 0, hi0, device=device).expand(B, -1)
        self.trace.count("refreshed", committed.numel())
        positions = torch.cat([committed, torch.arange(hi0, block.hi1 - 1, device=device).expand(B, -1)], dim=1)
        out = self.verifier(positions, torch.cat([self.high.gather(1, committed), draft[:, :-1]], dim=1))
        self.trace.count("verify_steps", 1)
        self.high[:, hi0:block.hi1] = draft
        if self.trace.keep_rounds:
            self.drafted = self.low.cpu().clone(), self.high.cpu().clone()
        return warp(out[:, -n:] if block.k > 0 else torch.cat([self.first_high, out], dim=1), self.warpers)

    def check(self, block: Block, draft: torch.Tensor, logp: torch.Tensor) -> Acceptance:
        """4-5. Pooled acceptance, then local rejection: the rejected positions grown by the radius from t0 on."""
        cfg, B, G = self.cfg, self.B, self.G
        images = torch.arange(B, device=self.device)[:, None].expand(-1, block.size)
        positions = torch.arange(block.hi0, block.hi1, device=self.device).expand(B, -1)
        accepted = self.passes(logp, draft, images, positions)
        rows = block.size // G
        redo = expand((~accepted).view(B, rows, G), cfg.radius, cfg.rejection).reshape(B, -1)
        t0 = first_rejected(redo.view(B, rows, G))
        stale = ~redo & (torch.arange(block.size, device=self.device)[None] > t0[:, None])
        return Acceptance(accepted, redo, stale)

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

    def resample(self, block: Block, draft: torch.Tensor, logp: torch.Tensor, acceptance: Acceptance) -> None:
        """6. R_X splits into islands, resampled concurrently by the verifier (or one after another)."""
        cfg, trace, G, hi0, redo = self.cfg, self.trace, self.G, block.hi0, acceptance.redo
        # expanded=reverify: the grown positions keep their drafts in context until re-tested
        grown = redo & acceptance.accepted if cfg.expanded == "reverify" else None
        self.verifier.forget_mask(_on_grid(redo if grown is None else redo & ~grown, hi0, G * G))
        trace.count("stale_kv", acceptance.stale.sum())
        schedules = [IslandSchedule.of(redo[b], hi0, G, cfg.resample, cfg.resample_window) for b in range(self.B)]
        # a sampled test redraws a rejected position outside its draft's pool (and a grown one whose re-test fails)
        redraw = Redraw(acceptance.rejected, draft, self.pool, hi0) if self.sampled else None
        draws = Draws(self.seed, self.ids, self.warpers, self.passes, redraw)
        steps, kept = IslandResampler(self.verifier, self.high, hi0, block.size, schedules, draws, trace, grown,
                                      cfg.resample_jacobi).run(logp)
        redo = redo & ~kept
        trace.count("resample_steps", steps)
        trace.count("drafted", self.B * block.size)
        trace.count("accepted", (~redo).sum())
        trace.count("resampled", redo.sum())
        trace.round(lambda: Round(*(_on_grid(m, hi0, G * G).cpu() for m in
                                    (torch.ones_like(redo), ~redo, acceptance.rejected, redo)),
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
