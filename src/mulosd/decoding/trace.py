"""What a decoding run did: forward passes per model, sequential steps on the critical path, wall-clock,
and per round the masks of drafted / accepted / rejected / resampled grid positions."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class Round:
    drafted: torch.Tensor  # [B, N] bool
    accepted: torch.Tensor
    rejected: torch.Tensor
    resampled: torch.Tensor
    # MuLo-SD's intermediate tokens, for pictures of a round: the low-res grid right after drafting the
    # block [B, g*g] (committed rows down-sampled, this block drafted, later rows 0), and the high-res grid
    # with the block's up-sampled draft in place [B, G*G] (earlier rows committed, later rows 0)
    low_draft: torch.Tensor | None = None
    high_draft: torch.Tensor | None = None


@dataclass
class Trace:
    strategy: str
    forwards: dict[str, int] = field(default_factory=dict)  # model name -> forward passes
    tokens_in: dict[str, int] = field(default_factory=dict)  # model name -> token slots processed
    steps: int = 0  # sequential forward passes on the critical path
    wall_s: float = 0.0
    rounds: list[Round] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # strategy-specific tallies (accepted, stale_kv, ...)
    _t0: float = field(default=0.0, repr=False)

    def start(self) -> Trace:
        self._t0 = time.perf_counter()
        return self

    def stop(self, **backbones) -> Trace:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.wall_s = time.perf_counter() - self._t0
        for name, bb in backbones.items():
            self.forwards[name], self.tokens_in[name] = bb.calls, bb.tokens_in
        return self

    def summary(self) -> str:
        fw = ", ".join(f"{k} {v}" for k, v in self.forwards.items())
        extra = "".join(f", {k} {v}" for k, v in self.counts.items())
        return f"{self.strategy}: {self.steps} sequential steps, forwards [{fw}], {self.wall_s:.2f} s{extra}"
