"""What a decoding run did: forward passes per model, sequential steps on the critical path, wall-clock,
strategy-specific tallies, and (only when asked) per round the masks of drafted / accepted / rejected /
resampled grid positions.

The trace is the decoders' one recorder. It reads the backbones' own counters as differences between
`start` and `stop` (a decoder never resets or writes them), keeps tallies as they come (a tensor stays a
tensor until `stop`, so counting costs no device sync inside the timed loop), and copies a round's masks
to the CPU only when `keep_rounds` is set (pictures and tests ask; the bench does not).
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
    stages: dict[str, float] = field(default_factory=dict)  # seconds of work around the decode (Tar's LLM, ...)
    keep_rounds: bool = False  # record per-round masks in `rounds`
    images: int = 0  # images decoded
    tokens: int = 0  # tokens generated, all images together
    _t0: float = field(default=0.0, repr=False)
    _backbones: dict = field(default_factory=dict, repr=False)  # name -> (backbone, calls, tokens_in) at start

    def start(self, *tallies: str, **backbones) -> Trace:
        """Start the clock; `tallies` start at 0 in this order; `backbones` (name=ARBackbone) are counted."""
        self.counts = dict.fromkeys(tallies, 0)
        self._backbones = {name: (bb, bb.calls, bb.tokens_in) for name, bb in backbones.items()}
        self._t0 = time.perf_counter()
        return self

    def count(self, name: str, n) -> None:
        """Add n (an int or a scalar tensor) to a tally."""
        self.counts[name] = self.counts.get(name, 0) + n

    def round(self, snapshot: Callable[[], Round]) -> None:
        """Record a round; `snapshot` builds it (device -> CPU copies) and runs only when rounds are kept."""
        if self.keep_rounds:
            self.rounds.append(snapshot())

    def stop(self) -> Trace:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.wall_s = time.perf_counter() - self._t0
        for name, (bb, calls, tokens_in) in self._backbones.items():
            self.forwards[name], self.tokens_in[name] = bb.calls - calls, bb.tokens_in - tokens_in
        self.counts = {k: int(v) for k, v in self.counts.items()}
        return self

    def counters(self) -> dict[str, float]:
        """Hardware-independent counters, per image: verifier forwards, tokens per verifier forward, sequential
        steps, and mean drafts accepted per verifier forward (0 for strategies that draft nothing)."""
        v, n = self.forwards.get("verifier", 0), max(self.images, 1)
        return {"verifier_forwards": v, "tokens_per_verifier_forward": self.tokens / n / v if v else 0.0,
                "sequential_steps": self.steps, "accepted_per_verification": self.counts.get("accepted", 0) / n / v
                if v else 0.0}

    def summary(self) -> str:
        fw = ", ".join(f"{k} {v}" for k, v in self.forwards.items())
        extra = "".join(f", {k} {v}" for k, v in self.counts.items())
        c = self.counters()
        return (f"{self.strategy}: {self.steps} sequential steps, forwards [{fw}], "
                f"{c['tokens_per_verifier_forward']:.2f} tokens per verifier forward, {self.wall_s:.2f} s{extra}")
