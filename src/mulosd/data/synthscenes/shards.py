"""Writing SynthScenes as webdataset shards with the member layout of a LAION-COCO-Aesthetic shard.

Each sample is `<key>.png` (or `.jpg`), `<key>.txt` (the caption) and `<key>.json` (caption, size, the
structured prompt and the full scene, so the judge and the evaluation can read the truth). Shards are
written to a temporary file in the target directory and renamed into place, so a killed writer never
leaves a half-written shard under a final name; the scenes are a pure function of (seed, index), so shards
are written in parallel and any one can be rewritten identically.
"""

from __future__ import annotations

import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import webdataset as wds
from PIL import Image

from ...atomic import atomic_write, remove_stale_temporaries
from .caption import caption_text
from .render import render
from .scene import sample_scene
from .vocab import RADIUS_RANGE

# Validation scenes come from indices no training shard reaches.
VAL_FIRST_INDEX = 1_000_000_000


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.tar"


def shard_pattern(split: str, num_shards: int, first: int = 0) -> str:
    """Brace pattern of a split's shards first .. first+num_shards-1, as webdataset expands it."""
    last = first + num_shards - 1
    return f"{split}-{{{first:05d}..{last:05d}}}.tar" if num_shards > 1 else shard_name(split, first)


def encode_image(image, image_format: str) -> bytes:
    buf = io.BytesIO()
    if image_format == "png":
        Image.fromarray(image).save(buf, format="PNG", compress_level=1)
    elif image_format == "jpg":
        Image.fromarray(image).save(buf, format="JPEG", quality=95)
    else:
        raise ValueError(f"image_format must be png or jpg, got {image_format!r}")
    return buf.getvalue()


def write_shard(path: Path, seed: int, first_index: int, count: int, size: int, image_format: str = "png",
                radius: tuple[float, float] = RADIUS_RANGE) -> Path:
    """Write scenes first_index .. first_index+count-1 of world `seed` (objects of half-size in `radius`)
    to one tar, atomically."""
    def write(f) -> None:
        with wds.TarWriter(f) as sink:
            for index in range(first_index, first_index + count):
                scene = sample_scene(seed, index, radius=radius)
                caption = caption_text(scene.prompt)
                meta = {"caption": caption, "width": size, "height": size, "seed": seed, "index": index,
                        "category": scene.prompt.category, "scene": scene.to_dict()}
                image = encode_image(render(scene, size), image_format)
                sink.write({"__key__": f"{seed:04d}{index:09d}", image_format: image, "txt": caption,
                            "json": json.dumps(meta)})

    return atomic_write(Path(path), write)


def _one_thread() -> None:
    """A shard worker's math libraries on one thread: the workers already fill the cores, and a BLAS pool per
    worker (as many threads as cores, in as many workers) spins against the others (docs/log.md)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def write_split(out_dir: Path, split: str, num_shards: int, per_shard: int, size: int, seed: int,
                first_index: int = 0, image_format: str = "png", workers: int | None = None,
                progress: bool = True, radius: tuple[float, float] = RADIUS_RANGE, first_shard: int = 0
                ) -> list[Path]:
    """Write shards first_shard .. first_shard+num_shards-1 of `per_shard` scenes each (shard i holds scenes
    first_index + i * per_shard onwards); shards already present are kept (resumable)."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir, f".{split}-*.tmp-*")
    shards = range(first_shard, first_shard + num_shards)
    paths = [out_dir / shard_name(split, i) for i in shards]
    todo = [(p, seed, first_index + i * per_shard, per_shard, size, image_format, tuple(radius))
            for i, p in zip(shards, paths, strict=True) if not p.exists()]
    workers = workers or min(len(todo), os.cpu_count() or 1) or 1
    with tqdm(total=len(todo), desc=f"writing {split} shards", unit="shard",
              disable=not (progress and todo)) as bar:  # no bar when every shard is there
        if workers == 1:
            for args in todo:
                write_shard(*args)
                bar.update()
        else:
            with ProcessPoolExecutor(workers, initializer=_one_thread) as pool:
                for _ in pool.map(write_shard, *zip(*todo, strict=True)):
                    bar.update()
    return paths
