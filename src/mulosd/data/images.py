"""Decoding untrusted image bytes into RGB arrays, with every conversion made explicit and counted.

Real shards (LAION-COCO-Aesthetic) hold greyscale, palette, RGBA, 16-bit and CMYK images next to plain
RGB ones, plus truncated or non-image bytes and the occasional decompression bomb. Pillow's defaults get
several of these wrong silently (16-bit PNGs saturate to white, alpha is dropped to whatever colour hides
under it, a photo's EXIF orientation is ignored so it arrives on its side), so each case is handled here and
named, for the stream to count.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
_FORMATS = ("JPEG", "PNG", "WEBP")
# Transparent pixels are composited onto this colour, so hidden colour under alpha 0 never leaks in.
ALPHA_BACKGROUND = (255, 255, 255)
_EXIF_ORIENTATION = 0x0112  # 1: upright; 2-8: mirrored and/or rotated (what a camera wrote)


class BadSample(Exception):
    """A sample that cannot be used; `kind` names the reason for the stream's counters."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def load_rgb(data: bytes, max_pixels: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """Decode image bytes to uint8 RGB [H, W, 3], upright; returns the array and the conversions applied
    (empty for a plain upright RGB image).

    Raises BadSample('corrupt_image' | 'too_large' | 'unsupported_image').
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data), formats=_FORMATS)
            if im.width * im.height > max_pixels:
                raise BadSample("too_large", f"{im.width}x{im.height} exceeds {max_pixels} pixels")
            im.load()
    except BadSample:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise BadSample("too_large", str(e)) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        raise BadSample("corrupt_image", f"{type(e).__name__}: {e}") from None
    upright = _upright(im)
    rgb, conversion = _to_rgb(upright or im)
    return rgb, (("exif_orientation",) if upright else ()) + ((conversion,) if conversion else ())


def _upright(im: Image.Image) -> Image.Image | None:
    """The image turned as its EXIF orientation says, or None when it is upright already."""
    try:
        orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
    except (OSError, ValueError, SyntaxError):  # unreadable EXIF: the pixels are still good, taken as stored
        return None
    if orientation not in range(2, 9):
        return None
    return ImageOps.exif_transpose(im)


def _to_rgb(im: Image.Image) -> tuple[np.ndarray, str | None]:
    mode = im.mode
    if mode == "RGB":
        return np.asarray(im), None
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit grey: scale to 8 bits ourselves; Pillow's convert('RGB') clips at 255.
        a = np.asarray(im).astype(np.int64)
        a = np.clip(a, 0, 65535) // 257
        return np.repeat(a.astype(np.uint8)[..., None], 3, axis=2), "sixteen_bit"
    if mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in im.info) or \
            (mode in ("L", "RGB") and "transparency" in im.info):
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        return np.asarray(Image.alpha_composite(canvas, rgba).convert("RGB")), "alpha"
    if mode == "CMYK":
        return np.asarray(im.convert("RGB")), "cmyk"
    if mode in ("L", "1"):
        return np.asarray(im.convert("RGB")), "grayscale"
    if mode == "P":
        return np.asarray(im.convert("RGB")), "palette"
    if mode in ("YCbCr", "LAB", "HSV", "RGBX", "RGBa"):
        return np.asarray(im.convert("RGB")), "colorspace"
    raise BadSample("unsupported_image", f"image mode {mode!r} has no faithful RGB conversion")


def square_resize(image: np.ndarray, size: int) -> np.ndarray:
    """Resize the shorter side to `size` (antialiased bicubic) and centre-crop to size x size."""
    im = Image.fromarray(image)
    w, h = im.size
    scale = size / min(w, h)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.Resampling.BICUBIC, reducing_gap=3.0)
    left, top = (nw - size) // 2, (nh - size) // 2
    return np.asarray(im.crop((left, top, left + size, top + size)))


def downsample(image: np.ndarray, factor: int) -> np.ndarray:
    """Antialiased bicubic downsampling of a square image by an integer factor."""
    size = image.shape[0] // factor
    return np.asarray(Image.fromarray(image).resize((size, size), Image.Resampling.BICUBIC, reducing_gap=3.0))

def to_tensor(image: np.ndarray) -> torch.Tensor:
    """uint8 [H, W, 3] -> float [3, H, W] in [-1, 1]."""
    return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).float().div_(127.5).sub_(1.0)


def to_image(tensor: torch.Tensor) -> np.ndarray:
    """float [3, H, W] in [-1, 1] -> uint8 [H, W, 3]."""
    return ((tensor.detach().float().cpu() + 1.0) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 0).numpy()
