"""Speculative decoding at one resolution: a small drafter proposes `gamma` tokens in raster order, the
verifier checks them in one forward. Everything after the first rejection is discarded (raster-scan).

- `acceptance="exact"`: standard speculative sampling, lossless: accept x~ with probability min(1, p/q); at
  the first rejection draw from norm(max(0, p - q)); when all are accepted draw a bonus token from p.
- `acceptance="lantern"`: LANTERN's relaxation: p(x~) is replaced by the mass of x~ and its k nearest codes,
  of which at most delta may come from the neighbours.

Each image advances by its own accepted length (batch > 1 in lockstep: images that are done, or whose window
runs past the grid, rewrite a final position, a no-op). The uniforms of the acceptance test, the drafter's
draws and the verifier's draws use separate noise streams keyed by (seed, image, position).
"""

from __future__ import annotations

import torch

from ..ar import ARBackbone, Warpers, warp
from ..ar.backbone import padded_writes
from ..ar.noise import ACCEPT, DRAFT, uniform
from ..ar.sampling import sample
from .acceptance import accepted_prefix, pooled_mass, residual
from .knobs import SDConfig
from .trace import Trace


@torch.no_grad()
def decode_sd(verifier: ARBackbone, drafter: ARBackbone, captions: list[str], cfg: SDConfig = SDConfig(),
              seed: int = 0, warpers: Warpers | None = None, image_ids: torch.Tensor | None = None,
              neighbours: torch.Tensor | None = None, progress=None) -> tuple[torch.Tensor, Trace]:
    if drafter.grid != verifier.grid:
        raise ValueError(f"sd needs a same-resolution drafter: grids {drafter.grid} and {verifier.grid}")
    if cfg.acceptance == "lantern" and neighbours is None:
        raise ValueError("lantern acceptance needs the codebook neighbour table")
    run = _SD(verifier, drafter, len(captions), cfg, seed, warpers or Warpers(), image_ids, neighbours)
    B = len(captions)
    run.trace = trace = Trace(f"sd_{cfg.acceptance}", images=B, tokens=B * run.N).start(
        "drafted", "accepted", verifier=verifier, drafter=drafter)
    run.begin(captions)
    while min(run.n) < run.N:
        lengths = [min(cfg.gamma, run.N - n) for n in run.n]  # an image near the end drafts fewer
        drafts, q = run.draft(lengths)
        out = run.verify(drafts, lengths)
        for b in range(run.B):
            if run.n[b] < run.N:
                run.accept(b, drafts[b, :lengths[b]], q[b, :lengths[b]], out[b])
        if progress is not None:
            progress.update(1)
    trace.steps = run.steps
    return run.tokens.view(run.B, verifier.grid, verifier.grid), trace.stop()


class _SD:
    """One speculative-decoding run: the committed tokens and what each cache holds; a method per step."""

    trace: Trace

    def __init__(self, verifier: ARBackbone, drafter: ARBackbone, B: int, cfg: SDConfig, seed: int,
                 warpers: Warpers, image_ids: torch.Tensor | None, neighbours: torch.Tensor | None):
        self.verifier, self.drafter, self.cfg, self.seed, self.warpers = verifier, drafter, cfg, seed, warpers
        self.neighbours = neighbours
        self.B, self.N, self.device = B, verifier.grid ** 2, verifier.device
        self.ids = (torch.arange(B) if image_ids is None else image_ids).to(self.device)
        self.tokens = torch.zeros(B, self.N, dtype=torch.long, device=self.device)
        self.n = [0] * B  # committed tokens per image
        self.d_written = [0] * B  # the drafter's cache holds committed tokens [0, d_written)
        self.v_written = [0] * B  # likewise for the verifier
        self.steps = 0

    def begin(self, captions: list[str]) -> None:
        self.q0, self.p0 = self.drafter.start(captions), warp(self.verifier.start(captions), self.warpers)
        self.steps = 1

    def draft(self, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter proposes lengths[b] tokens per image, one forward a token; the first forward also writes
        the committed tokens it has not seen. -> drafts [B, gamma], the drafter's log-probabilities [B, gamma, V]."""
        B, n, device, tokens = self.B, self.n, self.device, self.tokens
        gamma = max(lengths)
        drafts = torch.zeros(B, gamma, dtype=torch.long, device=device)
        q = torch.zeros(B, gamma, self.q0.shape[-1], device=device)
        for i in range(gamma):
            rows = []
            for b in range(B):
                if i == 0:
                    rows.append([(p, int(tokens[b, p])) for p in range(self.d_written[b], n[b])])
                elif i < lengths[b]:
                    rows.append([(n[b] + i - 1, int(drafts[b, i - 1]))])
                else:
                    rows.append([])
            if any(rows):
                pos, tok, real = padded_writes([r or [(max(n[b] - 1, 0), int(tokens[b, max(n[b] - 1, 0)]))]
                                                for b, r in enumerate(rows)], device)
                logits = self.drafter(pos, tok, lengths=real)
                last = torch.tensor([max(len(r) - 1, 0) for r in rows], device=device)
                step_logits = logits[torch.arange(B), last][:, None]
                self.steps += 1
            else:  # i == 0 at the very start: the prefix's logits
                step_logits = self.q0
            if i == 0:
                at_start = torch.tensor([n[b] == 0 for b in range(B)], device=device)[:, None, None]
                step_logits = torch.where(at_start, self.q0, step_logits)
            q[:, i] = warp(step_logits, self.warpers)[:, 0]
            pos_i = torch.tensor([[min(n[b] + i, self.N - 1)] for b in range(B)], device=device)
            drafts[:, i] = sample(q[:, i:i + 1], self.seed, self.ids, pos_i, stream=DRAFT)[:, 0]
        for b in range(B):
            self.d_written[b] = n[b] + lengths[b] - 1
        return drafts, q

    def verify(self, drafts: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """One verifier forward writes the committed tokens it has not seen and every draft; its outputs give p
        at each draft and a bonus position. -> warped log-probabilities [B, m, V] over the writes."""
        n, tokens, N = self.n, self.tokens, self.N
        rows = [[(p, int(tokens[b, p])) for p in range(self.v_written[b], n[b])] +
                [(n[b] + i, int(drafts[b, i])) for i in range(lengths[b])] for b in range(self.B)]
        rows = [r or [(N - 1, int(tokens[b, N - 1]))] for b, r in enumerate(rows)]  # a finished image: a no-op
        pos, tok, real = padded_writes(rows, self.device)
        self.steps += 1
        return warp(self.verifier(pos, tok, lengths=real), self.warpers)

    def accept(self, b: int, d: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> None:
        """Image b keeps the longest prefix of its drafts d [g] that passes the test, then draws one token: from
        the residual at the first rejection, else a bonus from p; rejected drafts leave both caches."""
        cfg, n, device, g = self.cfg, self.n[b], self.device, len(d)
        base = n - self.v_written[b]  # index of the first draft in this image's writes
        # p for draft i is the output of the slot before it; for draft 0 at position 0, the prefix's
        p_prev = self.p0[b, 0] if n == 0 else out[base - 1]
        p = torch.stack([p_prev] + [out[base + i] for i in range(g - 1)])  # [g, V]
        positions = torch.arange(n, n + g, device=device)
        p_d = p.gather(-1, d[:, None])[:, 0].exp()
        if cfg.acceptance == "lantern":
            p_d = pooled_mass(p[None], d[None], self.neighbours, cfg.pool_k, cfg.delta)[0]
        q_d = q.gather(-1, d[:, None])[:, 0].exp()
        u = uniform(self.seed, self.ids[b:b + 1], positions[None], ACCEPT)[0]
        j = int(accepted_prefix(p_d / q_d.clamp_min(1e-30), u))
        self.tokens[b, n:n + j] = d[:j]
        self.trace.count("drafted", g)
        self.trace.count("accepted", j)
        key = self.ids[b:b + 1]
        if j < g:
            dist = residual(p[j:j + 1], q[j:j + 1])[None]
            self.tokens[b, n + j] = sample(dist, self.seed, key, positions[None, j:j + 1])[0, 0]
            self.verifier.forget(positions[None, j:], rows=torch.tensor([b]))
            self.drafter.forget(positions[None, j:], rows=torch.tensor([b]))
            self.v_written[b] = n + j
            self.d_written[b] = min(self.d_written[b], n + j)
        else:
            self.v_written[b] = n + g
            if n + g < self.N:
                bonus = out[base + g - 1]
                self.tokens[b, n + g] = sample(bonus[None, None], self.seed, key,
                                               torch.tensor([[n + g]], device=device))[0, 0]
        self.n[b] = min(self.N, n + j + 1)
