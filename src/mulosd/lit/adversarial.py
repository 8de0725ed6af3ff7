"""The manual-optimisation step shared by every generator trained against a PatchGAN (the tokenizer, the
samplers): generator update, then discriminator update, each guarded against non-finite values.

One batch is one step of each optimizer whatever happens (a skipped update still "steps" without gradients),
so Lightning's step counter stays twice the batch counter, and the batch counter is what a resumed run and
the GAN warm-up count in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class AdversarialSteps:
    """Mixin for a LightningModule with `guard` (NonFiniteGuard), `optim` (clip_g, clip_d), `batches_seen`
    and two optimizers (generator, discriminator)."""

    def adversarial_step(self, g_loss: torch.Tensor, discriminator: Callable[[], tuple] | None, n: int) -> dict | None:
        """Update the generator on `g_loss`, then the discriminator on `discriminator()` -> (loss, logs) when it is
        given (None before the GAN warm-up ends, or without a GAN). Returns the discriminator's logs, or None
        when the generator loss was not finite and the whole batch was skipped. `n` counts batches from 1."""
        opt_g, opt_d = self.optimizers()
        if self.guard.nonfinite("generator loss", g_loss, n):
            self.skip_step()
            return None
        opt_g.zero_grad(set_to_none=True)
        self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=self.cfg.optim.clip_g, gradient_clip_algorithm="norm")
        opt_g.step()
        opt_d.zero_grad(set_to_none=True)
        clean, logs = True, {}
        if discriminator is not None:
            d_loss, d_logs = discriminator()
            clean = not self.guard.nonfinite("discriminator loss", d_loss, n)
            if clean:
                self.manual_backward(d_loss)
                self.clip_gradients(opt_d, gradient_clip_val=self.cfg.optim.clip_d, gradient_clip_algorithm="norm")
                logs = d_logs
        opt_d.step()  # a no-op without gradients (before the warm-up, or skipped)
        if clean:
            self.guard.clean()
        self.batches_seen += 1
        return logs

    def skip_step(self) -> None:
        """The whole batch skipped: no weight moves, both optimizers still count a step."""
        self.guard.skip_step(self.optimizers())
        self.batches_seen += 1
