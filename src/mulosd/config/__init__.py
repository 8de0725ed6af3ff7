"""Structured config schemas, registered with Hydra, and the checks run before any work starts: one module per
application (`train`, `infer`, `bench`), the named choices they share (`choices`), and here what they all use.

Every config group's YAML is merged onto a dataclass, so a typo'd key (in YAML or on the command line) or a
value of the wrong type fails at composition with the full key named. `validate_*` then catches what types
cannot: keys smuggled in with `++`, and values out of range. Both end as one-line errors. This package and its
`infer` and `bench` modules import no torch (`python infer.py --help` and a config error stay fast); the
training schema nests the models' own config dataclasses, so `config.train` does.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..checks import ConfigError, one_of, require
from ..paths import CONF

__all__ = ["ConfigError", "check_keys", "one_of", "register_configs", "require", "with_overrides"]


def register_configs() -> None:
    """Every application's schema (tests, the notebook); an entry point registers only its own."""
    from . import bench, infer, train

    for app in (train, infer, bench):
        app.register()


def check_keys(cfg: DictConfig, schema: type, prefix: str = "") -> DictConfig:
    """Reject keys the schema does not have (Hydra lets `++key=value` add them past the schema) and values
    of the wrong type; returns the config merged onto the schema (typed, defaults filled in)."""
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as e:
        key = prefix + str(getattr(e, "full_key", None) or "")
        raise ConfigError(key or "config", str(e).splitlines()[0]) from None


def with_overrides(cfg: DictConfig, overrides) -> DictConfig:
    """A copy of cfg with these keys set (a key cfg does not have is refused by the next validation)."""
    out = OmegaConf.create(OmegaConf.to_container(cfg))
    for key, value in (overrides or {}).items():
        OmegaConf.update(out, str(key), value, force_add=True)
    return out


def check_group_choices(argv: list[str], conf_dir: Path = CONF) -> None:
    """`group=option` overrides name an existing conf/group/option.yaml. Hydra reports a missing option in
    12-20 lines (every option, its search path); this says it in one line before Hydra starts. Sweeps
    (`loss=token_ce,gan`) are checked option by option; other sweep syntax is left to Hydra."""
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if not sep or "(" in value or "/" in key or "." in key or not (conf_dir / key).is_dir():
            continue
        options = sorted(p.stem for p in (conf_dir / key).glob("*.yaml"))
        for choice in value.split(","):
            if choice not in (*options, "null"):
                raise ConfigError(key, f"{choice!r} is not one of {', '.join(options)} (conf/{key}/)")


def check_model_chosen(argv: list[str], conf_dir: Path = CONF) -> None:
    """train.py: a `model.*` or `loss.*` setting needs a model to set it on (train.yaml chooses none). Without
    one Hydra reports a struct error and suggests `+key=`, which leads to `model.name: missing`."""
    keys = [a.lstrip("+~").partition("=")[0] for a in argv if "=" in a]
    if any(k in ("experiment", "model") for k in keys):
        return
    loose = [k for k in keys if k.split(".")[0] in ("model", "loss") and "." in k]
    if loose:
        experiments = ", ".join(sorted(p.stem for p in (conf_dir / "experiment").glob("*.yaml")))
        raise ConfigError(loose[0], f"no model is chosen to set it on: add experiment=NAME ({experiments}) or "
                                    "model=ar|sampler|tokenizer")


@contextlib.contextmanager
def exit_on_config_error():
    """Turn a ConfigError into one line on stderr and exit status 2, instead of a traceback."""
    try:
        yield
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
