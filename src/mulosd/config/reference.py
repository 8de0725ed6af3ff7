"""docs/reference.md, written from the schemas: every command, every key, its default and what it does.

    python -m mulosd.config.reference            # rewrites docs/reference.md (a test fails when it is stale)

A key's text is its field's `help` (decoding knobs and infer / bench options) or, for the training schema, the
comment on its line in the source; the defaults are the dataclasses'. Nothing here is written by hand but the
headings, so the reference cannot disagree with what the commands accept.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import json
import tokenize
import typing
from pathlib import Path

from ..paths import CONF, ROOT

OUT = ROOT / "docs" / "reference.md"


def _comments(cls) -> dict[str, str]:
    """A dataclass's fields -> the comment that ends their line in its source (the training schema's help)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # a subclass's own comments win
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        name = None
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and tok.start[1] == 4 and name is None:
                name = tok.string
            elif tok.type == tokenize.COMMENT and name:
                out[name] = tok.string.lstrip("# ").strip()
            if tok.type in (tokenize.NEWLINE, tokenize.NL):
                name = None
    return out


def _default(f: dataclasses.Field, owner=None) -> str:
    if owner is not None:  # a nested dataclass as its parent builds it (its factory may set other values)
        value = getattr(owner, f.name)
    elif f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return ""
    else:
        return "(required)"
    return f"`{json.dumps(value)}`" if value is None or isinstance(value, bool | list | dict) else f"`{value}`"


def table(cls, prefix: str = "", owner=None) -> list[str]:
    """One row per key of a dataclass (`owner`: the instance whose values are the defaults), nested dataclasses
    flattened under their key."""
    comments = _comments(cls)
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("key", "") is None:
            continue
        key = prefix + f.metadata.get("key", f.name)
        text = (f.metadata.get("help") or comments.get(f.name, "")).replace("|", "\\|")
        nested = getattr(owner, f.name) if owner is not None else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(nested):
            rows += table(type(nested), key + ".", nested)
            continue
        rows.append(f"| `{key}` | {_default(f, owner)} | {text} |")
        optional = [t for t in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(t)]
        if nested is None and optional:  # an optional group: its keys with the defaults it takes once set
            rows += table(optional[0], key + ".", optional[0]())
    return rows


HEADER = ["| key | default | what it does |", "|---|---|---|"]


def render() -> str:
    from ..decoding.registry import STRATEGIES
    from .bench import BenchConfig
    from .infer import InferOptions
    from .train import MODEL_SCHEMAS, TrainConfig

    lines = ["# Reference", "",
             "Every option of `infer.py`, `bench.py` and `train.py` with its default, written from the schemas by "
             "`python -m mulosd.config.reference` (do not edit by hand). Set one with `key=value`; a mistake is a "
             "one-line error naming the key.", "",
             "## infer.py", "", "`python infer.py [key=value ...]`: prompts to images, judged.", "", *HEADER,
             *table(InferOptions), "", "### Decoding knobs", "",
             "Each strategy's own knobs (`decoding=NAME`), from its dataclass in `src/mulosd/decoding/knobs.py`; "
             "bench.py takes them as `infer.KEY`.", ""]
    done = set()
    for name, strategy in STRATEGIES.items():
        if strategy.config is None:
            lines += [f"`{name}`: no knobs of its own.", ""]
        elif strategy.config in done:
            owner = next(n for n, s in STRATEGIES.items() if s.config is strategy.config)
            lines += [f"`{name}`: the knobs of `{owner}`.", ""]
        else:
            done.add(strategy.config)
            lines += [f"`{name}` ({strategy.config.__doc__.splitlines()[0]})", "", *HEADER,
                      *table(strategy.config), ""]
    lines += ["## bench.py", "", "`python bench.py [key=value ...]`: every strategy against `ar` on the same prompts "
              "and seeds, interleaved.", "", *HEADER, *[r for r in table(BenchConfig) if not r.startswith("| `infer.")],
              "| `infer.KEY` | | any infer.py option or knob above |", "",
              "## train.py", "", "`python train.py [experiment=NAME] [group=option ...] [key=value ...]`.", "",
              "Config groups (`group=option`, files under `conf/`):", ""]
    for group in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name != "hydra"):
        lines.append(f"- `{group.name}`: " + ", ".join(f"`{p.stem}`" for p in sorted(group.glob("*.yaml"))))
    lines += ["", "The run:", "", *HEADER, *[r for r in table(TrainConfig) if not r.startswith("| `model`")], ""]
    for name, schema in MODEL_SCHEMAS.items():
        lines += [f"`model={name}`:", "", *HEADER, *table(schema, "model."), ""]
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.write_text(render())
    print(f"reference -> {args.out}")


if __name__ == "__main__":
    main()
