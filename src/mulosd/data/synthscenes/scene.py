"""Scenes and prompts of the SynthScenes world, and the seeded sampler that draws them.

A `Prompt` is the structured form of a caption: what the caption requires (objects, counts, colours, a
relation, the background). A `Scene` is one concrete layout that satisfies a prompt; the renderer turns it
into pixels at any size. Sampling goes prompt first, then layout, so every scene's caption is true of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from . import vocab


@dataclass(frozen=True)
class ObjectSpec:
    """One noun phrase of a caption: `count` objects of `shape`, optionally of one `colour`."""

    shape: str
    colour: str | None = None
    texture: str = "solid"
    count: int = 1

    def __post_init__(self):
        if self.shape not in vocab.SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; known: {', '.join(vocab.SHAPES)}")
        if self.colour is not None and self.colour not in vocab.COLOURS:
            raise ValueError(f"unknown colour {self.colour!r}; known: {', '.join(vocab.COLOURS)}")
        if self.texture not in vocab.OBJECT_TEXTURES:
            raise ValueError(f"unknown texture {self.texture!r}; known: {', '.join(vocab.OBJECT_TEXTURES)}")
        if not 1 <= self.count <= vocab.MAX_OBJECTS:
            raise ValueError(f"count must be in 1..{vocab.MAX_OBJECTS}, got {self.count}")


@dataclass(frozen=True)
class Prompt:
    """The requirements a caption states. `relation` relates objects[0] to objects[1]."""

    objects: tuple[ObjectSpec, ...]
    background: str | None = None  # None: the caption leaves it open and the layout draws one
    background_texture: str | None = None
    relation: str | None = None

    def __post_init__(self):
        if not 1 <= len(self.objects) <= 2:
            raise ValueError("a prompt names one or two kinds of object")
        if sum(o.count for o in self.objects) > vocab.MAX_OBJECTS:
            raise ValueError(f"a scene holds at most {vocab.MAX_OBJECTS} objects")
        if self.relation is not None and (self.relation not in vocab.RELATIONS or len(self.objects) != 2
                                          or any(o.count != 1 for o in self.objects)):
            raise ValueError("a relation needs exactly two single objects and one of "
                             + ", ".join(vocab.RELATIONS))
        if self.background is not None and self.background not in vocab.BACKGROUND_COLOURS:
            raise ValueError(f"unknown background colour {self.background!r}")
        if self.background_texture is not None and self.background_texture not in vocab.BACKGROUND_TEXTURES:
            raise ValueError(f"unknown background texture {self.background_texture!r}")

    @property
    def category(self) -> str:
        """GenEval's task category, read off the structure (as GenEval's prompt templates define them)."""
        if len(self.objects) == 1:
            obj = self.objects[0]
            if obj.count > 1:
                return "counting"
            return "colors" if obj.colour else "single_object"
        if self.relation:
            return "position"
        if all(o.colour for o in self.objects):
            return "color_attr"
        return "two_object"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Prompt:
        return cls(objects=tuple(ObjectSpec(**o) for o in d["objects"]), background=d.get("background"),
                   background_texture=d.get("background_texture"), relation=d.get("relation"))


@dataclass(frozen=True)
class SceneObject:
    """A placed object; centre and radius are fractions of the image side (resolution-free)."""

    shape: str
    colour: str
    texture: str
    cx: float
    cy: float
    radius: float


@dataclass(frozen=True)
class Scene:
    prompt: Prompt
    objects: tuple[SceneObject, ...]
    background: str
    background_texture: str
    background_seed: int  # fixes the background's noise, stripe angle, gradient or photo crop
    cells: tuple[int, ...] = field(default=())  # grid cell of each object, row-major

    def to_dict(self) -> dict:
        return {"prompt": self.prompt.to_dict(), "objects": [asdict(o) for o in self.objects],
                "background": self.background, "background_texture": self.background_texture,
                "background_seed": self.background_seed, "cells": list(self.cells)}

    @classmethod
    def from_dict(cls, d: dict) -> Scene:
        return cls(prompt=Prompt.from_dict(d["prompt"]), objects=tuple(SceneObject(**o) for o in d["objects"]),
                   background=d["background"], background_texture=d["background_texture"],
                   background_seed=int(d["background_seed"]), cells=tuple(d.get("cells", ())))


def _choice(rng: np.random.Generator, options):
    options = list(options)
    return options[int(rng.integers(len(options)))]


def sample_prompt(rng: np.random.Generator, category: str | None = None) -> Prompt:
    """Draw a prompt of a GenEval category (uniform over the six when not given)."""
    category = category or _choice(rng, vocab.CATEGORIES)
    if category not in vocab.CATEGORIES:
        raise ValueError(f"unknown category {category!r}; known: {', '.join(vocab.CATEGORIES)}")
    texture = lambda: _choice(rng, vocab.OBJECT_TEXTURES)  # noqa: E731
    shape_a, shape_b = (str(s) for s in rng.choice(vocab.SHAPES, size=2, replace=False))
    colour_a, colour_b = (str(c) for c in rng.choice(list(vocab.COLOURS), size=2, replace=False))
    relation = None
    if category == "single_object":
        objects = (ObjectSpec(shape_a, None, texture()),)
    elif category == "colors":
        objects = (ObjectSpec(shape_a, colour_a, texture()),)
    elif category == "counting":
        objects = (ObjectSpec(shape_a, None, texture(), count=int(rng.integers(2, vocab.MAX_OBJECTS + 1))),)
    elif category == "two_object":
        objects = (ObjectSpec(shape_a, None, texture()), ObjectSpec(shape_b, None, texture()))
    elif category == "position":
        objects = (ObjectSpec(shape_a, None, texture()), ObjectSpec(shape_b, None, texture()))
        relation = _choice(rng, vocab.RELATIONS)
    else:  # color_attr
        objects = (ObjectSpec(shape_a, colour_a, texture()), ObjectSpec(shape_b, colour_b, texture()))
    return Prompt(objects=objects, background=_choice(rng, vocab.BACKGROUND_COLOURS),
                  background_texture=_choice(rng, vocab.BACKGROUND_TEXTURES), relation=relation)


def untaught(prompt: Prompt) -> str | None:
    """Why `sample_prompt` never draws a prompt of this composition, or None where it does. The judge reads any
    prompt the grammar parses, but a model trained on the world has never seen these: a low score says little."""
    objects, coloured = prompt.objects, [o.colour is not None for o in prompt.objects]
    if prompt.background is None or prompt.background_texture is None:
        return "the world's captions always name the background's texture and colour"
    if len(objects) == 2 and objects[0].shape == objects[1].shape:
        return "the world's two-object captions name two different shapes"
    if prompt.category in ("counting", "position") and any(coloured):
        return f"the world's {prompt.category} captions name no colour"
    if len(objects) == 2 and coloured[0] != coloured[1]:
        return "the world's two-object captions colour both objects or neither"
    if len(objects) == 2 and all(coloured) and objects[0].colour == objects[1].colour:
        return "the world's colour-attribute captions give the two objects different colours"
    return None


def _cells_for(prompt: Prompt, rng: np.random.Generator) -> list[int]:
    """Distinct grid cells, one per object; a relation puts object 0 strictly on its side of object 1."""
    n = sum(o.count for o in prompt.objects)
    if prompt.relation is None:
        return [int(c) for c in rng.permutation(vocab.GRID * vocab.GRID)[:n]]
    pairs = []
    for a in range(vocab.GRID * vocab.GRID):
        for b in range(vocab.GRID * vocab.GRID):
            (ra, ca), (rb, cb) = divmod(a, vocab.GRID), divmod(b, vocab.GRID)
            ok = {"above": ra < rb, "below": ra > rb, "left of": ca < cb, "right of": ca > cb}[prompt.relation]
            if ok:
                pairs.append((a, b))
    return list(pairs[int(rng.integers(len(pairs)))])


def realise(prompt: Prompt, rng: np.random.Generator, radius: tuple[float, float] = vocab.RADIUS_RANGE) -> Scene:
    """Lay out one scene that satisfies `prompt`; unspecified colours are drawn at random. `radius` is the
    range of object half-sizes (fractions of the image side): the world's geometry."""
    if not 0 < radius[0] <= radius[1] <= vocab.MAX_RADIUS:
        raise ValueError(f"object radius range {tuple(radius)} must lie in (0, {vocab.MAX_RADIUS:.4f}] so that an "
                         "object stays inside its grid cell")
    cells = _cells_for(prompt, rng)
    cell = 1.0 / vocab.GRID
    placed = []
    kinds = [spec for spec in prompt.objects for _ in range(spec.count)]
    for spec, c in zip(kinds, cells, strict=True):
        row, col = divmod(c, vocab.GRID)
        size = float(rng.uniform(*radius))
        slack = cell / 2 - size - vocab.CELL_MARGIN  # how far the centre may move and stay in its cell
        cx = (col + 0.5) * cell + float(rng.uniform(-slack, slack))
        cy = (row + 0.5) * cell + float(rng.uniform(-slack, slack))
        colour = spec.colour or _choice(rng, vocab.COLOURS)
        placed.append(SceneObject(spec.shape, colour, spec.texture, cx, cy, size))
    return Scene(prompt=prompt, objects=tuple(placed),
                 background=prompt.background or _choice(rng, vocab.BACKGROUND_COLOURS),
                 background_texture=prompt.background_texture or _choice(rng, vocab.BACKGROUND_TEXTURES),
                 background_seed=int(rng.integers(2**31)), cells=tuple(cells))


def sample_scene(seed: int, index: int, category: str | None = None,
                 radius: tuple[float, float] = vocab.RADIUS_RANGE) -> Scene:
    """Scene `index` of the world with `seed`: a pure function of both (and of the object radius range), so
    shards can be written in parallel."""
    rng = np.random.default_rng([seed, index])
    return realise(sample_prompt(rng, category), rng, tuple(radius))
