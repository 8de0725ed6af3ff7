"""The SynthScenes judge: does an image satisfy a caption's requirements?

It plays GenEval's detector for this world, analytically, and sees objects as a person does: object pixels
are the saturated ones (backgrounds are drawn at low saturation); a connected region of them, whatever its
colours, is one object, unless its colours taken apart fit shapes better than the whole (objects of
different colours that touch). An object's shape is the template that fits it best, placed from its area
and centroid, if it fits well enough and clearly better than the others (else it is a blob of no shape); a
visible hole makes any object a ring, and a cross needs four arms (its outline's radial profile). Seams that
a generator's washed-out stripes cut into an object are closed first. Its colour is the palette colour
(nearest in hue) of a clear majority of its pixels, or none when no colour has one (a two-coloured object).
The checks then follow GenEval's rules: presence (at least one), exact counts for counting prompts, colours,
and relative position of centroids.
The background's colour is checked too, separately, because in this world the caption names it.

`selftest` measures the judge against ground truth: each scene is judged against its true caption (the
judge must say yes) and against a minimally falsified one (it must say no), rendered clean, degraded, and
with the defects of generated images (speckles, washed-out texture, two-coloured objects, touching
objects). How it agrees with
people on generated images is `python -m mulosd.reports.judge_audit` (docs/judge.md)."""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage import color as skcolor

from . import vocab
from .render import hue_of, render, shape_mask
from .scene import ObjectSpec, Prompt, Scene, sample_scene

# Bumped with every change of a rule: a verdict stored by an older version (a bench cell) is judged again.
VERSION = 5
OBJECT_MIN_SATURATION = 0.5  # backgrounds are drawn at saturation 0.3, objects at ~0.8
OBJECT_MIN_VALUE = 0.18
# What a person recognises as an object of a shape; the last four were measured on labelled generated images
# (docs/judge.md): a generator's specks, lumpy blobs and thick rings are what they separate.
MIN_MATCH = 0.45  # below this a component is no shape: e.g. the hue fringe where orange meets green
MIN_AREA = 0.004  # smallest object, as a fraction of the image (the world's smallest: ~0.011); below, a speck
CIRCLE_MIN_MATCH = 0.83  # any compact blob fits a disc fairly well: a circle must fit it closely
SQUARE_MIN_MATCH = 0.77  # a lumpy blob fits a square fairly well too
CROSS_MIN_FOURFOLD = 0.6  # a cross has four arms: its outline's distance from the centre varies mostly with a
#                           period of a quarter turn (this share of the variation; a splat's is spread out)
SHAPE_MARGIN = 0.03  # the best shape must fit clearly better than the next: else it is a blob of no shape
RING_MIN_HOLE = 0.1  # an object whose enclosed holes are this share of its filled area is a ring
DOMINANT = 0.65  # an object has the colour of more than this share of its pixels, or none (people call a 60/40
#                  object two-coloured)
RELATION_MARGIN = 0.05  # centroids must differ by this fraction of the image side
GREY_MAX_SATURATION = 0.12
# A generator draws an object's stripes and dots (its darker shade) washed out, below the saturation floor, and
# they cut seams into the object; a closing of this many pixels (at 128 px) mends them. The world keeps objects
# several pixels apart, so it does not join two objects.
SEAM_CLOSING = 1


@dataclass(frozen=True)
class Detection:
    shape: str
    colour: str | None  # None: no palette colour covers more than DOMINANT of it (a two-coloured object)
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


def shape_scores(component: np.ndarray) -> dict[str, float]:
    """How well a component mask fits each shape: soft IoU with the shape's template.

    Each hypothesis is placed from the component's area and centroid alone (a square of the same area, a
    triangle whose centroid sits a third below its box centre, ...), then rasterised with supersampling and
    compared. Area and centroid barely move under blur or JPEG ringing, unlike a bounding box.
    """
    area = float(component.sum())
    rows, cols = np.nonzero(component)
    cy, cx = rows.mean() + 0.5, cols.mean() + 0.5
    scores = {}
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
        scores[shape] = float(np.minimum(window, cover).sum() / (np.maximum(window, cover).sum() + outside))
    return scores


def radial_harmonics(component: np.ndarray, bins: int = 72, harmonics: int = 8) -> np.ndarray:
    """How the outline's distance from the centroid varies around it: the magnitudes of harmonics 1..`harmonics`
    of that distance (as a share of its mean) over the angle. A triangle's variation is mostly harmonic 3, a
    square's and a cross's harmonic 4; a blob's is spread over many."""
    rows, cols = np.nonzero(component)
    cy, cx = rows.mean(), cols.mean()
    edge = component & ~ndimage.binary_erosion(component)
    er, ec = np.nonzero(edge)
    angle = np.arctan2(er - cy, ec - cx)
    which = ((angle + np.pi) / (2 * np.pi) * bins).astype(int) % bins
    radius = np.zeros(bins)
    np.maximum.at(radius, which, np.hypot(er - cy, ec - cx) + 0.5)
    seen = np.flatnonzero(radius)
    if len(seen) < bins:  # a small outline leaves some directions empty: interpolate them around the circle
        radius = np.interp(np.arange(bins), np.r_[seen - bins, seen, seen + bins], np.tile(radius[seen], 3))
    return np.abs(np.fft.rfft(radius / radius.mean()))[1:harmonics + 1] * 2 / bins


def _classify_shape(component: np.ndarray) -> tuple[str, float, bool]:
    """Best-fitting shape of a component mask, its soft IoU with that shape, and whether a person would
    recognise it as that shape (it fits well enough, and clearly better than any other shape, or it has a
    visible hole; a cross also needs four arms)."""
    # a visible hole makes an object a ring, however thick or angular it is: no other shape has one
    filled = ndimage.binary_fill_holes(component)
    if (filled.sum() - component.sum()) >= RING_MIN_HOLE * filled.sum():
        scores = shape_scores(component)
        match = max(scores["circle"], scores["ring"])
        return "ring", match, match >= MIN_MATCH
    # smaller holes are its texture (a generator's dots), not its shape
    scores = shape_scores(filled)
    first, second = sorted(scores, key=scores.get, reverse=True)[:2]
    floor = {"circle": CIRCLE_MIN_MATCH, "square": SQUARE_MIN_MATCH}.get(first, MIN_MATCH)
    recognised = scores[first] >= floor and scores[first] - scores[second] >= SHAPE_MARGIN
    if recognised and first == "cross":
        h = radial_harmonics(filled)
        recognised = h[3] >= CROSS_MIN_FOURFOLD * np.sqrt((h ** 2).sum())
    return first, scores[first], recognised


def _fit(component: np.ndarray, top: int, left: int, h: int, w: int, colour: str | None
         ) -> tuple[Detection, bool]:
    """One object (component: bool mask at offset top, left) and whether it is recognised as its shape."""
    shape, match, recognised = _classify_shape(component)
    rows, cols = np.nonzero(component)
    return Detection(shape, colour, (cols.mean() + left + 0.5) / w, (rows.mean() + top + 0.5) / h,
                     float(component.sum() / (h * w)), match), recognised


def _objects(region: np.ndarray, hues: np.ndarray, top: int, left: int, h: int, w: int
             ) -> list[tuple[Detection, bool]]:
    """The objects in one connected region of object pixels (any colours), each with whether it is recognised
    as its shape: one object of the region's shape, coloured by the palette colour of a clear majority of its
    pixels (none if no colour has more than DOMINANT of them); or, where the region's colours taken apart fit
    shapes better than the whole does (objects of different colours that touch), one object per colour
    component."""
    names = list(vocab.COLOURS)
    min_px = MIN_AREA * h * w
    shares = np.bincount(hues[region], minlength=len(names)) / region.sum()
    whole, whole_ok = _fit(region, top, left, h, w,
                           names[int(shares.argmax())] if shares.max() > DOMINANT else None)
    parts = []
    for ci in np.flatnonzero(shares * region.sum() >= min_px):
        labels, n = ndimage.label(region & (hues == ci), structure=np.ones((3, 3)))
        for sl, idx in zip(ndimage.find_objects(labels), range(1, n + 1), strict=True):
            component = labels[sl] == idx
            if component.sum() >= min_px:
                parts.append(_fit(component, top + sl[0].start, left + sl[1].start, h, w, names[ci]))
    if len(parts) > 1:
        covered = sum(d.area for d, _ in parts)
        split = sum(d.match * d.area for d, ok in parts if ok) / covered
        if split > (whole.match if whole_ok else 0.0):
            return parts
    return [(whole, whole_ok)]


JUDGED_SIZE = 128  # smaller images are enlarged to this first


def detect(image: np.ndarray) -> tuple[list[Detection], str]:
    """Objects in a uint8 RGB image recognised as their shapes, and the background's colour name."""
    recognised, _, background = _detect(image)
    return recognised, background


def _enlarged(image: np.ndarray) -> np.ndarray:
    """An image smaller than JUDGED_SIZE, enlarged bilinearly: its anti-aliased edges then place object
    boundaries between its pixels, and shapes are told apart at the sizes the thresholds were measured at."""
    if min(image.shape[:2]) >= JUDGED_SIZE:
        return image
    scale = JUDGED_SIZE / min(image.shape[:2])
    size = (round(image.shape[1] * scale), round(image.shape[0] * scale))
    return np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))


def _object_pixels(hsv: np.ndarray) -> np.ndarray:
    is_object = (hsv[..., 1] >= OBJECT_MIN_SATURATION) & (hsv[..., 2] >= OBJECT_MIN_VALUE)
    return is_object | ndimage.binary_closing(is_object, structure=np.ones((3, 3)), iterations=SEAM_CLOSING)


def _regions(is_object: np.ndarray) -> list[tuple[tuple[slice, slice], np.ndarray]]:
    labels, n = ndimage.label(is_object, structure=np.ones((3, 3)))
    min_px = MIN_AREA * is_object.size
    return [(sl, region) for sl, idx in zip(ndimage.find_objects(labels), range(1, n + 1), strict=True)
            if (region := labels[sl] == idx).sum() >= min_px]


def object_regions(image: np.ndarray) -> list[tuple[tuple[slice, slice], np.ndarray]]:
    """The connected regions of object pixels (any colours; specks dropped) the judge reads objects from, each
    as (its bounding slices, its mask within them), in the image as judged (enlarged to JUDGED_SIZE)."""
    return _regions(_object_pixels(skcolor.rgb2hsv(_enlarged(image))))


def name_shape(region: np.ndarray) -> str | None:
    """The shape a person would name a region (bool mask) by the judge's rules, or None (a blob)."""
    shape, _, recognised = _classify_shape(region)
    return shape if recognised else None


def _detect(image: np.ndarray) -> tuple[list[Detection], list[Detection], str]:
    """(objects recognised as their shapes, objects too rough to name (with the shape they fit best), the
    background's colour name)."""
    image = _enlarged(image)
    h, w = image.shape[:2]
    hsv = skcolor.rgb2hsv(image)
    is_object = _object_pixels(hsv)
    colour_index = _nearest_hue(hsv[..., 0] * 360.0)
    objects = []
    for sl, region in _regions(is_object):
        objects += _objects(region, colour_index[sl], sl[0].start, sl[1].start, h, w)
    names = list(vocab.COLOURS)
    background = ~ndimage.binary_dilation(is_object, iterations=2)
    mean_rgb = image[background].reshape(-1, 3).mean(axis=0) if background.any() else image.reshape(-1, 3).mean(0)
    sat = skcolor.rgb2hsv(mean_rgb.reshape(1, 1, 3) / 255.0)[0, 0, 1]
    bg = "gray" if sat < GREY_MAX_SATURATION else names[int(_nearest_hue(np.array(hue_of(mean_rgb))))]
    return [d for d, ok in objects if ok], [d for d, ok in objects if not ok and d.match >= MIN_MATCH], bg


def _is_of(d: Detection, spec: ObjectSpec) -> bool:
    return d.shape == spec.shape and spec.colour in (None, d.colour)


def _relation_holds(rel: str, a: Detection, b: Detection) -> bool:
    return {"above": a.cy + RELATION_MARGIN < b.cy, "below": a.cy > b.cy + RELATION_MARGIN,
            "left of": a.cx + RELATION_MARGIN < b.cx, "right of": a.cx > b.cx + RELATION_MARGIN}[rel]


def judge(image: np.ndarray, prompt: Prompt) -> Verdict:
    """Check every requirement of `prompt` on a uint8 RGB image [H, W, 3]. An exact count also fails when an
    object too rough to name fits the counted shape best: people count such objects (a square with a bite
    is a square to them), so the image's count is not the one asked."""
    detections, rough, background = _detect(image)
    exact = prompt.category == "counting"
    checks, matches = {}, []
    for i, spec in enumerate(prompt.objects):
        found = [d for d in detections if _is_of(d, spec)]
        matches.append(found)
        checks[f"object{i}"] = (len(found) == spec.count and not any(_is_of(d, spec) for d in rough)) if exact \
            else len(found) >= spec.count
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
    """The image degradations the self-test reports: 'clean', 'blur' (Gaussian, sigma 0.8 px), 'jpeg'
    (quality 75), 'speckled' (a generator's stray saturated pixels: 2 x 2 flecks of palette colours, each far
    below an object's area, seeded by the image), 'washed' (a generator's washed-out texture: the middle of each
    stripe or dot of an object's darker shade drawn at the background's saturation, a seam across the object)."""
    if kind == "clean":
        return image
    if kind == "blur":
        return np.clip(np.rint(ndimage.gaussian_filter(image.astype(np.float32), sigma=(0.8, 0.8, 0))), 0,
                       255).astype(np.uint8)
    if kind == "jpeg":
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="JPEG", quality=75)
        return np.asarray(Image.open(buf).convert("RGB"))
    if kind == "speckled":
        rng = np.random.default_rng(int.from_bytes(image[::7, ::7].tobytes()[:8].ljust(8, b"\0"), "little"))
        out = image.copy()
        h, w = image.shape[:2]
        palette = np.array(list(vocab.COLOURS.values()), dtype=np.uint8)
        for _ in range(h * w // 400):
            r, c = int(rng.integers(h - 1)), int(rng.integers(w - 1))
            out[r:r + 2, c:c + 2] = palette[int(rng.integers(len(palette)))]
        return out
    if kind == "washed":
        hsv = skcolor.rgb2hsv(image)
        saturated = hsv[..., 1] >= OBJECT_MIN_SATURATION
        # the darker shade of a texture: saturated pixels well below the brightest object pixel nearby
        dark = saturated & (hsv[..., 2] < 0.75 * ndimage.maximum_filter(np.where(saturated, hsv[..., 2], 0), size=7))
        core = ndimage.binary_erosion(dark, structure=np.ones((3, 3)))
        hsv[..., 1] = np.where(core, vocab.BACKGROUND_SATURATION, hsv[..., 1])
        return np.clip(np.rint(skcolor.hsv2rgb(hsv) * 255), 0, 255).astype(np.uint8)
    raise ValueError(f"unknown degradation {kind!r}")


SCENE_PERTURBATIONS = ("two_coloured", "touching")


def _other_colour(colour: str, rng: np.random.Generator) -> str:
    others = [c for c in vocab.COLOURS if c != colour]
    return others[int(rng.integers(len(others)))]


def perturbed_render(scene: Scene, size: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """`scene` drawn with a defect generated images show that leaves its caption true:

    two_coloured  one object has a minority share (30%, cut by a straight line at a random angle) in another
                  palette colour; its named colour, if any, still covers most of it
    touching      the second object is moved along the axis of the scene's relation (else the longer axis
                  between the two) until its box overlaps the first object's box by a tenth of its half-size,
                  in a colour other than the first's (one-object scenes are drawn unchanged)
    """
    objects = list(scene.objects)
    if kind == "two_coloured":
        i = int(rng.integers(len(objects)))
        image = render(scene, size)
        objects[i] = replace(objects[i], colour=_other_colour(objects[i].colour, rng))
        recoloured = render(replace(scene, objects=tuple(objects)), size)
        inside = (image != recoloured).any(axis=-1)
        theta = rng.uniform(0, 2 * np.pi)
        rows, cols = np.nonzero(inside)
        proj = cols * np.cos(theta) + rows * np.sin(theta)
        minority = proj > np.quantile(proj, 0.7)
        image[rows[minority], cols[minority]] = recoloured[rows[minority], cols[minority]]
        return image
    if kind == "touching":
        if len(objects) < 2:
            return render(scene, size)
        a, b = objects[0], objects[1]
        dx, dy = b.cx - a.cx, b.cy - a.cy
        along_x = scene.prompt.relation in ("left of", "right of") if scene.prompt.relation else abs(dx) >= abs(dy)
        gap = a.radius + 0.9 * b.radius
        cx, cy = (a.cx + np.sign(dx) * gap, a.cy) if along_x else (a.cx, a.cy + np.sign(dy) * gap)
        colour = _other_colour(a.colour, rng) if b.colour == a.colour else b.colour
        moved = replace(b, cx=float(cx), cy=float(cy), colour=colour)
        if any(max(abs(moved.cx - o.cx), abs(moved.cy - o.cy)) < moved.radius + o.radius for o in objects[2:]):
            return render(scene, size)  # it would cover a third object: the caption might no longer hold
        objects[1] = moved
        return render(replace(scene, objects=tuple(objects)), size)
    raise ValueError(f"unknown perturbation {kind!r}; known: {', '.join(SCENE_PERTURBATIONS)}")


@dataclass(frozen=True)
class SelftestResult:
    """Agreement with ground truth per (size, degradation) and per category."""

    table: dict  # (size, degradation) -> {category: agreement, "all": agreement}

    def agreement(self, size: int = 128, degradation: str = "clean", category: str = "all") -> float:
        return self.table[(size, degradation)][category]


DEGRADATIONS = ("blur", "jpeg", "speckled", "washed", *SCENE_PERTURBATIONS)


def selftest(n: int, seed: int = 12345, sizes=(32, 64, 128), degradations=DEGRADATIONS,
             degraded_size: int = 128, progress: bool = False, radius=vocab.RADIUS_RANGE) -> SelftestResult:
    """Judge `n` scenes (true and falsified caption each) clean at every size, and degraded or perturbed
    (`degrade`, `perturbed_render`) at one size; `radius` is the world's object size range."""
    from tqdm import tqdm

    conditions = [(s, "clean") for s in sizes] + [(degraded_size, d) for d in degradations]
    hits = {c: {} for c in conditions}
    for i in tqdm(range(n), desc="judge self-test", disable=not progress):
        scene = sample_scene(seed, i, radius=radius)
        wrong = falsify(scene, np.random.default_rng([seed, i, 1]))
        cat = scene.prompt.category
        renders = {s: render(scene, s) for s in {c[0] for c in conditions}}
        for size, kind in conditions:
            if kind in SCENE_PERTURBATIONS:
                img = perturbed_render(scene, size, kind, np.random.default_rng([seed, i, 2]))
            else:
                img = degrade(renders[size], kind)
            correct = [judge(img, scene.prompt).ok, not judge(img, wrong).ok]
            hits[(size, kind)].setdefault(cat, []).extend(correct)
    table = {}
    for cond, per_cat in hits.items():
        row = {cat: float(np.mean(v)) for cat, v in per_cat.items()}
        row["all"] = float(np.mean([x for v in per_cat.values() for x in v]))
        table[cond] = row
    return SelftestResult(table)
