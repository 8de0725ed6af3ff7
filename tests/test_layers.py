"""Layers import downward: a package may import from its own layer or below, never above. The table is the one
docs/architecture.md explains; a new package gets a row there and here."""

import ast
import importlib
import pkgutil

import pytest

import mulosd

from .conftest import ROOT

SRC = ROOT / "src" / "mulosd"
LAYERS = [  # bottom first
    {"atomic", "checks", "choices", "logs", "machine", "paths"},
    {"data"},
    {"tokenizer", "losses", "eval"},
    {"ar"},
    {"samplers"},
    {"decoding"},
    {"llamagen", "tar"},
    {"zoo", "config", "viz"},
    {"pipeline", "reports", "lit", "generate"},
    {"training", "inference", "bench", "reliability"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _imports(path):
    """(importing unit, imported unit) for every relative import in a module, at any depth."""
    unit, package = path.relative_to(SRC).parts[0].removesuffix(".py"), list(path.relative_to(SRC).parent.parts)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            names = node.module.split(".") if node.module else [node.names[0].name]
            target = (base + names)[0]
            if target != unit:
                yield unit, target


def test_every_package_has_a_layer():
    units = {p.name.removesuffix(".py") for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert units - {"__init__"} == set(LAYER)


@pytest.mark.parametrize("path", sorted(p for p in SRC.rglob("*.py") if p.name != "__main__.py"),
                         ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_downward(path):
    upward = [f"{unit} imports {target}" for unit, target in _imports(path) if LAYER[target] > LAYER[unit]]
    assert not upward, upward


def test_every_module_imports_on_its_own():
    """Every module imports (a cycle that breaks an import shows here)."""
    for info in pkgutil.walk_packages(mulosd.__path__, "mulosd."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


# the decoders are the part read most against the papers: no function there longer than a screen
DECODING_MAX_LINES = 60


@pytest.mark.parametrize("path", sorted((SRC / "decoding").glob("*.py")), ids=lambda p: p.name)
def test_no_decoding_function_is_longer_than_a_screen(path):
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > DECODING_MAX_LINES]
    assert not long, f"{path.name}: {', '.join(long)}"
