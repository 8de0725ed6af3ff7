"""The NaN guard of every training loop: a step whose data or loss is not finite is skipped and reported.

Skipping means no weight moves: gradients are dropped and every optimizer still "steps" without them (a
no-op for Adam) so that Lightning's step counter stays aligned with the batch counter. A discriminator loss
that is not finite skips only the discriminator's update. `limit` non-finite steps in a row stop the run:
a model that keeps producing them will not recover by itself. Nothing non-finite is ever written, since
`assert_finite` guards every checkpoint as well.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class NonFiniteGuard:
    def __init__(self, limit: int = 10):
        self.limit = limit
        self.in_a_row = 0
        self.skipped: list[tuple[int, str]] = []  # (batch, what) of every skip, also kept in checkpoints

    def nonfinite(self, what: str, value: torch.Tensor, batch: int) -> bool:
        """True (and reported) when `value` holds a NaN or an infinity; `batch` counts from 1."""
        if bool(torch.isfinite(value).all()):
            return False
        self.skipped.append((batch, what))
        self.in_a_row += 1
        log.warning("non-finite %s at batch %d: update skipped (%d in a row)", what, batch, self.in_a_row)
        if self.in_a_row >= self.limit:
            raise FloatingPointError(f"{self.limit} non-finite steps in a row (last: {what} at batch {batch}): "
                                     "stopping (check the data, or lower optim.lr)")
        return True

    def clean(self) -> None:
        """A step with nothing skipped."""
        self.in_a_row = 0

    @staticmethod
    def skip_step(optimizers) -> None:
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
            opt.step()

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "skipped": [list(s) for s in self.skipped]}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = int(state["in_a_row"])
        self.skipped = [(int(b), str(w)) for b, w in state["skipped"]]


def batch_images(batch: dict) -> torch.Tensor:
    """Every image tensor of a stream batch, flattened into one (what the data guard checks)."""
    return torch.cat([batch["image"].flatten(), *(v.flatten() for v in batch["low"].values())])
