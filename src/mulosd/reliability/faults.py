"""Fuzzed shards: 100 faults across 10 shards, each counted in its category exactly, none leaking a partial
sample into a batch, no pickle ever executed, no hang. The valid-sample throughput against clean shards is
measured and reported (median of interleaved repeats), not checked: it depends on what else the machine runs.

The shards are written here with a manifest of what each fault must produce: dropped samples counted by
reason (corrupt or truncated image bytes, duplicate members, missing or empty captions, missing images,
decompression-bomb sizes, a shard truncated mid-sample) and kept samples counted by conversion (16-bit,
CMYK, RGBA, palette), plus pickle members that must be skipped unread.
"""

from __future__ import annotations

import collections
import io
import pickle
import random
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

from ..data.stream import SKIP_KINDS, StreamStats, build_pipeline
from .common import Check, quiet

SIZE = 64
# fault -> (counter category, whether the sample is kept)
FAULTS = {"corrupt_bytes": ("corrupt_image", False), "truncated_image": ("corrupt_image", False),
          "duplicate_key": ("duplicate_member", False), "missing_caption": ("missing_caption", False),
          "empty_caption": ("missing_caption", False), "missing_image": ("missing_image", False),
          "huge_image": ("too_large", False), "sixteen_bit": ("sixteen_bit", True), "cmyk": ("cmyk", True),
          "rgba": ("alpha", True), "palette": ("palette", True), "pickle_member": ("ignored_member", True),
          "truncated_tar": ("truncated_tar", False)}


class Payload:
    """Unpickling this writes a marker file: proof that a pickle from the data was executed."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _png(im: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


class _Images:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self._huge = None

    def rgb(self, size: int = SIZE) -> Image.Image:
        return Image.fromarray(self.rng.integers(0, 255, (size, size, 3), dtype=np.uint8))

    def huge(self) -> bytes:
        if self._huge is None:  # 9000 x 9000 grey (81 Mpx, over the 64 Mpx limit): a few hundred KB as PNG
            self._huge = _png(Image.new("L", (9000, 9000), 128))
        return self._huge


def _members(kind: str, key: str, images: _Images, marker: Path) -> list[tuple[str, bytes]]:
    cap = b"a red circle above a blue square"
    good = _png(images.rgb())
    return {
        "valid": [(f"{key}.png", good), (f"{key}.txt", cap)],
        "corrupt_bytes": [(f"{key}.png", bytes(images.rng.integers(0, 255, 600, dtype=np.uint8))), (f"{key}.txt", cap)],
        "truncated_image": [(f"{key}.png", good[: len(good) // 2]), (f"{key}.txt", cap)],
        "duplicate_key": [(f"{key}.png", good), (f"{key}.png", good), (f"{key}.txt", cap)],
        "missing_caption": [(f"{key}.png", good)],
        "empty_caption": [(f"{key}.png", good), (f"{key}.txt", b"  \n\t")],
        "missing_image": [(f"{key}.txt", cap)],
        "huge_image": [(f"{key}.png", images.huge()), (f"{key}.txt", cap)],
        "sixteen_bit": [(f"{key}.png", _png(Image.fromarray(images.rng.integers(0, 65535, (SIZE, SIZE),
                                                                                dtype=np.uint16)))),
                        (f"{key}.txt", cap)],
        "cmyk": [(f"{key}.jpg", _png(images.rgb().convert("CMYK"), "JPEG")), (f"{key}.txt", cap)],
        "rgba": [(f"{key}.png", _png(images.rgb().convert("RGBA"))), (f"{key}.txt", cap)],
        "palette": [(f"{key}.png", _png(images.rgb().convert("P"))), (f"{key}.txt", cap)],
        "pickle_member": [(f"{key}.png", good), (f"{key}.txt", cap), (f"{key}.pyd", pickle.dumps(Payload(marker)))],
    }[kind]


def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_fuzzed(out: Path, shards: int = 10, faults: int = 100, valid_per_shard: int = 60, seed: int = 0) -> dict:
    """Fuzzed shards and their clean twins (the same valid samples, no faults); returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    rng, images = random.Random(seed), _Images(seed)
    marker = out / "pickle_was_executed"
    per_shard = [faults // shards + (i < faults % shards) for i in range(shards)]
    expected, kept, clean_urls, fuzzed_urls = collections.Counter(), set(), [], []
    for s, n in enumerate(per_shard):
        kinds = [rng.choice([k for k in FAULTS if k != "truncated_tar"]) for _ in range(n)]
        truncate = rng.random() < 0.5
        if truncate:
            kinds[-1] = "truncated_tar"
        order = ["valid"] * valid_per_shard + [k for k in kinds if k != "truncated_tar"]
        rng.shuffle(order)
        members, clean = [], []
        for i, kind in enumerate(order):
            key = f"s{s:02d}_{i:03d}_{kind}"
            m = _members(kind, key, images, marker)
            members += m
            if kind == "valid":
                clean += m
            if kind == "valid" or FAULTS[kind][1]:
                kept.add(key)
            if kind != "valid":
                expected[FAULTS[kind][0]] += 1
        fuzzed = out / f"fuzzed-{s:02d}.tar"
        if truncate:  # a last sample cut off inside its image bytes: one truncated_tar, that sample dropped
            tail_key = f"s{s:02d}_{len(order):03d}_truncated_tar"
            _write_tar(fuzzed, members + _members("valid", tail_key, images, marker))
            with tarfile.open(fuzzed) as tar:
                png = tar.getmember(f"{tail_key}.png")
            fuzzed.write_bytes(fuzzed.read_bytes()[: png.offset_data + png.size // 2])
            expected["truncated_tar"] += 1
        else:
            _write_tar(fuzzed, members)
        _write_tar(out / f"clean-{s:02d}.tar", clean)
        fuzzed_urls.append(str(fuzzed))
        clean_urls.append(str(out / f"clean-{s:02d}.tar"))
    return {"expected": dict(expected), "kept": kept, "faults": sum(per_shard), "marker": marker,
            "fuzzed": fuzzed_urls, "clean": clean_urls, "valid": shards * valid_per_shard}


def stream(urls: list[str], timeout: float = 120.0) -> tuple[list[dict], StreamStats, float]:
    """Stream every batch (in a thread, under a watchdog); returns batches, counts and seconds."""
    out: dict = {}

    def work():
        stats, batches, start = StreamStats(), [], time.perf_counter()
        for batch in build_pipeline(urls, image_size=SIZE, ratios=(2, 4), batch_size=8, seed=0, shuffle_buffer=0,
                                    resampled=False, max_pixels=64_000_000, partial=True, name="fuzz"):
            stats.update(batch)
            batches.append(batch)
        out.update(batches=batches, stats=stats, seconds=time.perf_counter() - start)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"streaming {len(urls)} shards did not finish within {timeout:.0f} s (a hang)")
    return out["batches"], out["stats"], out["seconds"]


def _whole(batch: dict) -> bool:
    n = len(batch["key"])
    return (batch["image"].shape == (n, 3, SIZE, SIZE) and batch["low"][2].shape == (n, 3, SIZE // 2, SIZE // 2)
            and batch["low"][4].shape == (n, 3, SIZE // 4, SIZE // 4) and len(batch["caption"]) == n
            and all(batch["caption"]) and bool(batch["image"].isfinite().all())
            and float(batch["image"].abs().max()) <= 1.0)


def run(work: Path, shards: int = 10, faults: int = 100, seed: int = 0, repeats: int = 5) -> Check:
    check = Check("faults")
    manifest = write_fuzzed(work / "fuzzed", shards, faults, seed=seed)
    try:
        with quiet(work / "stream.log"):  # 100 planted faults, logged at a decaying rate: the counts say it
            batches, stats, _ = stream(manifest["fuzzed"])
    except TimeoutError as e:
        check.trial(False, str(e))
        return check
    keys = [k for b in batches for k in b["key"]]
    # each fault is one trial: its category's count must match exactly (a miscount fails all of them)
    for category, n in sorted(manifest["expected"].items()):
        for _ in range(n):
            check.trial(stats.counts[category] == n, f"{category}: counted {stats.counts[category]}, planted {n}")
    unplanned = {k: v for k, v in stats.counts.items() if v and k not in manifest["expected"]}
    partial = sum(not _whole(b) for b in batches)
    leaked = set(keys) - manifest["kept"]
    missing = manifest["kept"] - set(keys)
    executed = manifest["marker"].exists()
    for problem, bad in (("unplanned counts", unplanned), ("partial batches", partial),
                         ("dropped samples in batches", sorted(leaked)[:5]), ("kept samples lost", sorted(missing)[:5]),
                         ("duplicate keys in batches", len(keys) != len(set(keys))), ("pickle executed", executed)):
        if bad:
            check.trial(False, f"{problem}: {bad}")
    with quiet(work / "stream.log"):  # interleaved pairs, so both sides of a ratio see the same load
        times = [(stream(manifest["clean"])[2], stream(manifest["fuzzed"])[2]) for _ in range(repeats)]
    ratio = float(np.median([(len(keys) / fuzz_s) / (manifest["valid"] / clean_s) for clean_s, fuzz_s in times]))
    check.figures.update(shards=shards, skipped=sum(stats.counts[k] for k in SKIP_KINDS), kept=len(keys),
                         partial=partial, pickles_executed=int(executed), throughput=f"{ratio:.0%}")
    return check
