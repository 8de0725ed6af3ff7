"""Quiet, useful logs for the entry points: every INFO event printed once (Lightning's loggers hand their records
to the handlers Hydra sets up, which print the message to the console and keep it, time-stamped, in RUN/NAME.log),
and the third-party warnings a user can do nothing about filtered at the source, each with the reason.
`configure()` runs once at the start of train.py, infer.py and bench.py."""

from __future__ import annotations

import logging
import warnings

# (message pattern, why nobody running this project can act on it)
IGNORED_WARNINGS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated",
     "Lightning calls a torch API that torch deprecated; nothing in this project uses it"),
    (r"Found \d+ module\(s\) in eval mode at the start of training",
     "the frozen parts (VQ decoder, LPIPS trunks, the EMA copy) are in eval mode on purpose"),
    (r"`\.fit\(ckpt_path=None\)` was called without a model|\.fit\(ckpt_path=\"last\"\) is set, but there is no last",
     "OnExceptionCheckpoint makes Lightning look for a last checkpoint; training.fit resumes only when asked"),
    (r"Checkpoint directory .* exists and is not empty",
     "a resumed run writes into its own checkpoint directory; a fresh run there is refused by training.fit"),
    (r"Precision bf16-mixed is not supported by the model summary",
     "the summary's size estimate only; the parameter counts it prints are right"),
    (r"The '\w+_dataloader' does not have many workers",
     "the worker count is data.num_workers, sized to this machine on purpose"),
)

# INFO records that advertise rather than inform
_ADVERTS = ("💡 Tip:",)

# `lightning` always adds its own console handler on import (every INFO line then printed twice, once by it and
# once by Hydra's root handler); the others add one when imported before logging is configured
_THIRD_PARTY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric")
# where Lightning's rank_zero_info writes (a filter acts on the logger a record is created on, not its parents)
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ADVERTS)


def configure() -> None:
    """Filter the warnings above and make Lightning's loggers propagate (once) instead of printing themselves."""
    for pattern, _why in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in _THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):  # Lightning adds its own stream handler when imported first
            logger.removeHandler(handler)
        logger.propagate = True
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAdverts) for f in logger.filters):
            logger.addFilter(_DropAdverts())
