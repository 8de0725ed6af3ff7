"""The one family of config checks: a value that cannot work is a `ConfigError` whose message starts with the full
key. Every schema (config/) and every strategy's knob dataclass (decoding/knobs.py) checks with these; it imports
nothing, so the torch-free schemas and the decoders read the same ones."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the full key, `detail` is the rest."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key}: {detail}")
        self.key, self.detail = key, detail


def require(ok: bool, key: str, detail: str) -> None:
    if not ok:
        raise ConfigError(key, detail)


def one_of(value, options, key: str) -> None:
    require(value in options, key, f"{value!r} is not one of {', '.join(map(str, options))}")
