"""Vector-exact rendering of a Scene at any size.

Every part of a scene is a function of continuous coordinates in [0, 1]^2 (shapes, stripes, dots, smooth
noise, gradients, photo crops), sampled on a supersampled grid and box-averaged. So the same scene rendered
at 32, 64, 128 or 256 px is the same picture at different resolutions: a low-res render agrees with an
area-downsampled high-res render up to the supersampling error.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import ndimage
from skimage import color as skcolor
from skimage import data as skdata

from . import vocab
from .scene import Scene, SceneObject

# Photos bundled in the scikit-image wheel (no download): grey-level textures for photographic backgrounds.
SUPERSAMPLE = 4  # samples per pixel side, box-averaged

PHOTOS = ("astronaut", "camera", "coffee", "chelsea", "rocket", "brick", "grass", "gravel", "moon", "coins")


@functools.cache
def _photo(name: str) -> np.ndarray:
    img = getattr(skdata, name)()
    grey = skcolor.rgb2gray(img) if img.ndim == 3 else img.astype(np.float64) / 255.0
    return np.ascontiguousarray(grey, dtype=np.float32)


def hue_of(rgb) -> float:
    """Hue in degrees of an RGB triple (any scale)."""
    h = skcolor.rgb2hsv(np.asarray(rgb, dtype=np.float64).reshape(1, 1, 3) / 255.0)[0, 0, 0]
    return float(h * 360.0)


def _cubic_weights(u: np.ndarray, n_knots: int) -> np.ndarray:
    """Catmull-Rom interpolation weights [len(u), n_knots] for positions u in [0, 1] over evenly spaced knots."""
    t = u * (n_knots - 1)
    i = np.floor(t).astype(int)
    f = t - i
    w = np.zeros((len(u), n_knots))
    taps = (-0.5 * f**3 + f**2 - 0.5 * f, 1.5 * f**3 - 2.5 * f**2 + 1, -1.5 * f**3 + 2 * f**2 + 0.5 * f,
            0.5 * f**3 - 0.5 * f**2)
    for k, tap in zip(range(-1, 3), taps, strict=True):
        np.add.at(w, (np.arange(len(u)), np.clip(i + k, 0, n_knots - 1)), tap)
    return w


def _background_value(texture: str, seed: int, u: np.ndarray) -> np.ndarray:
    """Brightness (HSV value) of the background at sample positions u (1-D, shared by x and y)."""
    rng = np.random.default_rng(seed)
    x, y = u[None, :], u[:, None]
    kind = vocab.BACKGROUND_TEXTURES[texture]
    if kind == "noise":  # two octaves of smooth value noise, separable cubic interpolation
        v = np.zeros((len(u), len(u)))
        for knots, amp in ((5, 0.65), (12, 0.35)):
            lattice = rng.random((knots, knots))
            w = _cubic_weights(u, knots)
            v += amp * (w @ lattice @ w.T)
        return 0.42 + 0.45 * np.clip(v, 0.0, 1.0)
    if kind == "stripes":
        angle = np.deg2rad(rng.choice([0.0, 45.0, 90.0, 135.0]))
        period = 1.0 / rng.choice([5, 7, 9])
        phase = (x * np.cos(angle) + y * np.sin(angle)) / period + rng.random()
        return np.where(np.mod(phase, 1.0) < 0.5, 0.55, 0.82)
    if kind == "gradient":
        angle = rng.uniform(0, 2 * np.pi)
        proj = (x - 0.5) * np.cos(angle) + (y - 0.5) * np.sin(angle)
        return 0.35 + 0.55 * (proj / np.sqrt(0.5) + 1.0) / 2.0
    # photo: a square crop of a bundled photo, bilinear in continuous coordinates
    photo = _photo(PHOTOS[int(rng.integers(len(PHOTOS)))])
    h, w = photo.shape
    side = rng.uniform(0.4, 1.0) * min(h, w)
    top, left = rng.uniform(0, h - side), rng.uniform(0, w - side)
    rows = np.broadcast_to(top + y * side - 0.5, (len(u), len(u)))
    cols = np.broadcast_to(left + x * side - 0.5, (len(u), len(u)))
    grey = ndimage.map_coordinates(photo, [rows, cols], order=1, mode="nearest")
    return 0.3 + 0.6 * grey


def shape_mask(shape: str, lx: np.ndarray, ly: np.ndarray) -> np.ndarray:
    """Inside test in an object's local frame, where its bounding box is [-1, 1]^2 (y points down)."""
    if shape == "circle":
        return lx**2 + ly**2 <= 1.0
    if shape == "square":
        return (np.abs(lx) <= 1.0) & (np.abs(ly) <= 1.0)
    if shape == "triangle":  # apex up, base down; base width equals height
        return (ly >= -1.0) & (ly <= 1.0) & (np.abs(lx) <= (ly + 1.0) / 2.0)
    if shape == "ring":
        r2 = lx**2 + ly**2
        return (r2 <= 1.0) & (r2 >= 0.55**2)
    if shape == "cross":
        arm = 0.36
        return ((np.abs(lx) <= arm) & (np.abs(ly) <= 1.0)) | ((np.abs(ly) <= arm) & (np.abs(lx) <= 1.0))
    raise ValueError(f"unknown shape {shape!r}")


def _texture_dark(texture: str, lx: np.ndarray, ly: np.ndarray) -> np.ndarray:
    """Where an object's texture uses the darker shade of its colour."""
    if texture == "striped":
        return np.mod((lx + ly) * 1.5, 1.0) < 0.5
    if texture == "dotted":
        dx, dy = np.mod(lx * 2.0, 1.0) - 0.5, np.mod(ly * 2.0, 1.0) - 0.5
        return dx**2 + dy**2 <= 0.28**2
    return np.zeros(np.broadcast(lx, ly).shape, dtype=bool)


def _draw(img: np.ndarray, obj: SceneObject, u: np.ndarray) -> None:
    lo, hi = np.searchsorted(u, obj.cx - obj.radius), np.searchsorted(u, obj.cx + obj.radius, side="right")
    top, bot = np.searchsorted(u, obj.cy - obj.radius), np.searchsorted(u, obj.cy + obj.radius, side="right")
    lx = (u[None, lo:hi] - obj.cx) / obj.radius
    ly = (u[top:bot, None] - obj.cy) / obj.radius
    inside = shape_mask(obj.shape, lx, ly)
    base = np.asarray(vocab.COLOURS[obj.colour], dtype=np.float64) / 255.0
    dark = _texture_dark(obj.texture, lx, ly)[..., None]
    rgb = np.where(dark, base * vocab.TEXTURE_SHADE, base)
    region = img[top:bot, lo:hi]
    region[inside] = np.broadcast_to(rgb, region.shape)[inside]


def object_mask(scene: Scene, grid: int) -> np.ndarray:
    """bool [grid, grid]: the cells of a grid x grid partition of the image (a VQ tokenizer's tokens) that
    hold any object pixel of the scene rendered at 8 px per cell (an f8 tokenizer's token), sampled at the
    renderer's own supersampling points. Training weights these tokens' loss: they carry what GenEval checks."""
    n = grid * 8 * SUPERSAMPLE
    u = (np.arange(n) + 0.5) / n
    covered = np.zeros((n, n), dtype=bool)
    for obj in scene.objects:
        lo, hi = np.searchsorted(u, obj.cx - obj.radius), np.searchsorted(u, obj.cx + obj.radius, side="right")
        top, bot = np.searchsorted(u, obj.cy - obj.radius), np.searchsorted(u, obj.cy + obj.radius, side="right")
        covered[top:bot, lo:hi] |= shape_mask(obj.shape, (u[None, lo:hi] - obj.cx) / obj.radius,
                                              (u[top:bot, None] - obj.cy) / obj.radius)
    cell = 8 * SUPERSAMPLE
    return covered.reshape(grid, cell, grid, cell).any(axis=(1, 3))


@functools.cache
def _background_tint(name: str) -> np.ndarray:
    """RGB at HSV value 1 of a background colour: the colour's hue at the background saturation.

    With hue and saturation fixed, HSV -> RGB is linear in the value, so a whole background is value * tint.
    """
    if name == "gray":
        return np.ones(3)
    hue = np.array([[[hue_of(vocab.COLOURS[name]) / 360.0, vocab.BACKGROUND_SATURATION, 1.0]]])
    return skcolor.hsv2rgb(hue)[0, 0]


def render(scene: Scene, size: int, supersample: int = SUPERSAMPLE) -> np.ndarray:
    """Render `scene` as uint8 RGB [size, size, 3]."""
    if size < 8:
        raise ValueError(f"size must be at least 8 px, got {size}")
    n = size * supersample
    u = (np.arange(n) + 0.5) / n
    value = _background_value(scene.background_texture, scene.background_seed, u)
    img = value[..., None] * _background_tint(scene.background)
    for obj in scene.objects:
        _draw(img, obj, u)
    img = img.reshape(size, supersample, size, supersample, 3).mean(axis=(1, 3))
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
