"""The SynthScenes judge: does an image satisfy a caption's requirements?

It plays GenEval's detector for this world, analytically: object pixels are the saturated ones
(backgrounds are drawn at low saturation), each is given the palette colour nearest in hue, connected
components of one colour are objects, and each object's shape is the template it overlaps most after
scaling its bounding square to a fixed size. The checks then follow GenEval's rules: presence (at least
one), exact counts for counting prompts, colours, and relative position of centroids. The background's
colour is checked too, separately, because in this world the caption names it.

`selftest` measures the judge against ground truth: each scene is judged against its true caption (the
judge must say yes) and against a minimally falsified one (it must say no).
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage import color as skcolor

from . import vocab
from .render import hue_of, render, shape_mask
from .scene import ObjectSpec, Prompt, Scene, sample_scene

OBJECT_MIN_SATURATION = 0.5  # backgrounds are drawn at saturation 0.3, objects at ~0.8
OBJECT_MIN_VALUE = 0.18
MIN_AREA = 0.0015  # smallest object component, as a fraction of the image (smallest real object: ~0.011)
MIN_MATCH = 0.45  # below this a component is no shape: e.g. the hue fringe where orange meets green
RELATION_MARGIN = 0.05  # centroids must differ by this fraction of the image side
GREY_MAX_SATURATION = 0.12


@dataclass(frozen=True)
class Detection:
    shape: str
    colour: str
    cx: float  # centroid, fraction of the image side
    cy: float
    area: float  # fraction of the image
    match: float  # soft IoU with the chosen shape's template


@dataclass(frozen=True)
class Verdict:
    checks: dict  # requirement name -> bool
    detections: tuple[Detection, ...]
    background: str

    @property
    def geneval(self) -> bool:
        """GenEval's pass/fail: every object, count, colour and relation requirement holds."""
        return all(v for k, v in self.checks.items() if k != "background")

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


@functools.cache
def _shape_moments() -> dict[str, tuple[float, float, float]]:
    """Per shape: the share of its bounding square it fills, and its centroid in the local [-1, 1] frame."""
    n = 512
    u = (np.arange(n) + 0.5) / n * 2.0 - 1.0
    out = {}
    for shape in vocab.SHAPES:
        m = shape_mask(shape, u[None, :], u[:, None])
        rows, cols = np.nonzero(m)
        out[shape] = (float(m.mean()), float(u[cols].mean()), float(u[rows].mean()))
    return out


@functools.cache
def _palette_hues() -> np.ndarray:
    return np.array([hue_of(rgb) for rgb in vocab.COLOURS.values()])


def _nearest_hue(hue_deg: np.ndarray) -> np.ndarray:
    d = np.abs(hue_deg[..., None] - _palette_hues())
    return np.argmin(np.minimum(d, 360.0 - d), axis=-1)


def _classify_shape(component: np.ndarray) -> tuple[str, float]:
    """Best-fitting shape of a component mask, and its soft IoU with that shape.

    Each hypothesis is placed from the component's area and centroid alone (a square of the same area, a
    triangle whose centroid sits a third below its box centre, ...), then rasterised with supersampling and
    compared. Area and centroid barely move under blur or JPEG ringing, unlike a bounding box.
    """
    area = float(component.sum())
    rows, cols = np.nonzero(component)
    cy, cx = rows.mean() + 0.5, cols.mean() + 0.5
    best, best_score = "circle", -1.0
    for shape, (fill, ox, oy) in _shape_moments().items():
        r = np.sqrt(area / fill) / 2.0
        pad = int(np.ceil(r)) + 2
        top, left = int(np.floor(cy - r * (1 + oy))) - pad, int(np.floor(cx - r * (1 + ox))) - pad
        size_r, size_c = int(2 * r) + 2 * pad + 2, int(2 * r) + 2 * pad + 2
        ss = 4
        ur = (np.arange(size_r * ss) + 0.5) / ss + top
        uc = (np.arange(size_c * ss) + 0.5) / ss + left
        m = shape_mask(shape, ((uc - cx) / r + ox)[None, :], ((ur - cy) / r + oy)[:, None])
        cover = m.reshape(size_r, ss, size_c, ss).mean(axis=(1, 3))
        window = np.zeros((size_r, size_c), dtype=np.float64)
        r0, c0 = max(top, 0), max(left, 0)
        r1, c1 = min(top + size_r, component.shape[0]), min(left + size_c, component.shape[1])
        window[r0 - top:r1 - top, c0 - left:c1 - left] = component[r0:r1, c0:c1]
        # component pixels outside the window count against the fit
        outside = area - window.sum()
        score = np.minimum(window, cover).sum() / (np.maximum(window, cover).sum() + outside)
        if score > best_score:
            best, best_score = shape, float(score)
    return best, best_score


def detect(image: np.ndarray) -> tuple[list[Detection], str]:
    """Objects in a uint8 RGB image, and the background's colour name."""
    h, w = image.shape[:2]
    hsv = skcolor.rgb2hsv(image)
    is_object = (hsv[..., 1] >= OBJECT_MIN_SATURATION) & (hsv[..., 2] >= OBJECT_MIN_VALUE)
    colour_index = _nearest_hue(hsv[..., 0] * 360.0)
    names = list(vocab.COLOURS)
    detections = []
    for ci, name in enumerate(names):
        labels, n = ndimage.label(is_object & (colour_index == ci), structure=np.ones((3, 3)))
        if n == 0:
            continue
        for sl, idx in zip(ndimage.find_objects(labels), range(1, n + 1), strict=True):
            component = labels[sl] == idx
            area = component.sum() / (h * w)
            if area < MIN_AREA:
                continue
            shape, match = _classify_shape(component)
            if match < MIN_MATCH:
                continue
            rows, cols = np.nonzero(component)
            detections.append(Detection(shape, name, (cols.mean() + sl[1].start + 0.5) / w,
                                        (rows.mean() + sl[0].start + 0.5) / h, float(area), match))
    background = ~ndimage.binary_dilation(is_object, iterations=2)
    mean_rgb = image[background].reshape(-1, 3).mean(axis=0) if background.any() else image.reshape(-1, 3).mean(0)
    sat = skcolor.rgb2hsv(mean_rgb.reshape(1, 1, 3) / 255.0)[0, 0, 1]
    bg = "gray" if sat < GREY_MAX_SATURATION else names[int(_nearest_hue(np.array(hue_of(mean_rgb))))]
    return detections, bg


def _relation_holds(rel: str, a: Detection, b: Detection) -> bool:
    return {"above": a.cy + RELATION_MARGIN < b.cy, "below": a.cy > b.cy + RELATION_MARGIN,
            "left of": a.cx + RELATION_MARGIN < b.cx, "right of": a.cx > b.cx + RELATION_MARGIN}[rel]


def judge(image: np.ndarray, prompt: Prompt) -> Verdict:
    """Check every requirement of `prompt` on a uint8 RGB image [H, W, 3]."""
    detections, background = detect(image)
    exact = prompt.category == "counting"
    checks, matches = {}, []
    for i, spec in enumerate(prompt.objects):
        found = [d for d in detections if d.shape == spec.shape and spec.colour in (None, d.colour)]
        matches.append(found)
        checks[f"object{i}"] = len(found) == spec.count if exact else len(found) >= spec.count
    if prompt.relation:
        checks["relation"] = any(_relation_holds(prompt.relation, a, b) for a in matches[0] for b in matches[1])
    if prompt.background:
        checks["background"] = background == prompt.background
    return Verdict(checks=checks, detections=tuple(detections), background=background)


_INVERSE = {"above": "below", "below": "above", "left of": "right of", "right of": "left of"}


def falsify(scene: Scene, rng: np.random.Generator) -> Prompt:
    """The smallest change to a scene's prompt that makes it false of the scene (one per GenEval category)."""
    p = scene.prompt
    objs = list(p.objects)
    absent = [s for s in vocab.SHAPES if s not in {o.shape for o in scene.objects}]
    cat = p.category
    if cat == "counting":
        n = objs[0].count
        objs[0] = ObjectSpec(objs[0].shape, objs[0].colour, objs[0].texture, n + 1 if n < vocab.MAX_OBJECTS else n - 1)
    elif cat == "colors":
        other = [c for c in vocab.COLOURS if c != scene.objects[0].colour]
        objs[0] = ObjectSpec(objs[0].shape, other[int(rng.integers(len(other)))], objs[0].texture)
    elif cat == "position":
        return Prompt(tuple(objs), p.background, p.background_texture, _INVERSE[p.relation])
    elif cat == "color_attr":
        a, b = objs
        objs = [ObjectSpec(a.shape, b.colour, a.texture), ObjectSpec(b.shape, a.colour, b.texture)]
    else:  # single_object, two_object: ask for a shape that is not there
        i = int(rng.integers(len(objs)))
        objs[i] = ObjectSpec(absent[int(rng.integers(len(absent)))], objs[i].colour, objs[i].texture)
    return Prompt(tuple(objs), p.background, p.background_texture, p.relation)


def degrade(image: np.ndarray, kind: str) -> np.ndarray:
    """The degradations the self-test reports: 'clean', 'blur' (Gaussian, sigma 0.8 px), 'jpeg' (quality 75)."""
    if kind == "clean":
        return image
    if kind == "blur":
        return np.clip(np.rint(ndimage.gaussian_filter(image.astype(np.float32), sigma=(0.8, 0.8, 0))), 0,
                       255).astype(np.uint8)
    if kind == "jpeg":
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="JPEG", quality=75)
        return np.asarray(Image.open(buf).convert("RGB"))
    raise ValueError(f"unknown degradation {kind!r}")


@dataclass(frozen=True)
class SelftestResult:
    """Agreement with ground truth per (size, degradation) and per category."""

    table: dict  # (size, degradation) -> {category: agreement, "all": agreement}

    def agreement(self, size: int = 128, degradation: str = "clean", category: str = "all") -> float:
        return self.table[(size, degradation)][category]


def selftest(n: int, seed: int = 12345, sizes=(32, 64, 128), degradations=("blur", "jpeg"),
             degraded_size: int = 128, progress: bool = False, radius=vocab.RADIUS_RANGE) -> SelftestResult:
    """Judge `n` scenes (true and falsified caption each) clean at every size, and degraded at one size;
    `radius` is the world's object size range."""
    from tqdm import tqdm

    conditions = [(s, "clean") for s in sizes] + [(degraded_size, d) for d in degradations]
    hits = {c: {} for c in conditions}
    for i in tqdm(range(n), desc="judge self-test", disable=not progress):
        scene = sample_scene(seed, i, radius=radius)
        wrong = falsify(scene, np.random.default_rng([seed, i, 1]))
        cat = scene.prompt.category
        renders = {s: render(scene, s) for s in {c[0] for c in conditions}}
        for size, kind in conditions:
            img = degrade(renders[size], kind)
            correct = [judge(img, scene.prompt).ok, not judge(img, wrong).ok]
            hits[(size, kind)].setdefault(cat, []).extend(correct)
    table = {}
    for cond, per_cat in hits.items():
        row = {cat: float(np.mean(v)) for cat, v in per_cat.items()}
        row["all"] = float(np.mean([x for v in per_cat.values() for x in v]))
        table[cond] = row
    return SelftestResult(table)
