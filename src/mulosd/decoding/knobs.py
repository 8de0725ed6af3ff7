"""A strategy's settings as one frozen dataclass that checks itself, built from any config by its field names.

Each knob dataclass (MuLoSDConfig, SDConfig, ZipARConfig) owns its choices and ranges; `from_config` reads one
field per config key (a field's `metadata["key"]` when the config calls it something else, e.g. infer.py's
`lantern_k` for LANTERN's `pool_k`), so infer.py's validation is the dataclasses' own, and a mistake is a
`KnobError` naming the config key.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


class KnobError(ValueError):
    """A setting out of range or not among its choices; `key` names it."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key}: {detail}")
        self.key, self.detail = key, detail


def check(ok: bool, key: str, detail: str) -> None:
    if not ok:
        raise KnobError(key, detail)


def one_of(value: Any, choices: tuple, key: str) -> None:
    check(value in choices, key, f"{value!r} is not one of {', '.join(map(str, choices))}")


def from_config(cls, cfg, **fixed):
    """`cls` built from `cfg` (a mapping): each field from the key its metadata names (default: its own name),
    unless given in `fixed`; a field whose key the config lacks keeps its default. A KnobError is re-raised
    naming the config key instead of the field."""
    keys = {f.name: f.metadata.get("key", f.name) for f in fields(cls)}
    values = {name: cfg[key] for name, key in keys.items() if name not in fixed and key is not None and key in cfg}
    try:
        return cls(**values, **fixed)
    except KnobError as e:
        raise KnobError(keys.get(e.key) or e.key, e.detail) from None
