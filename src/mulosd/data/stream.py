"""The webdataset stream every model trains on: shards -> samples -> checked, resized, batched tensors.

One pipeline serves SynthScenes and LAION-COCO-Aesthetic alike (same members: image, `.txt` caption,
optional `.json` metadata). Guarantees:
- only the expected members are ever read from a tar (pickles and anything else are skipped unread);
- every bad sample is dropped and counted by kind, logged at a decaying rate, with no sleeping;
- images that need a conversion (grey, palette, alpha, 16-bit, CMYK, EXIF orientation) are converted correctly
  and counted;
- shard resampling and shuffling are seeded per (rank, worker, epoch, seed): reproducible and distinct.

Counters live in whichever process runs the pipeline (a DataLoader worker); each batch carries the counts
accumulated since that worker's previous batch under the key "bad", and `StreamStats` sums them.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import random
import tarfile

import torch
import webdataset as wds
from webdataset.utils import make_seed, pytorch_worker_info, pytorch_worker_seed

from .images import IMAGE_EXTENSIONS, BadSample, downsample, load_rgb, square_resize, to_tensor

log = logging.getLogger(__name__)

CAPTION_EXTENSIONS = ("txt",)
META_EXTENSIONS = ("json",)
EXPECTED = frozenset(IMAGE_EXTENSIONS + CAPTION_EXTENSIONS + META_EXTENSIONS)

# Dropped samples (or shards) by reason, and images kept after a conversion.
SKIP_KINDS = ("unreadable_shard", "truncated_tar", "duplicate_member", "missing_image", "corrupt_image",
              "too_large", "unsupported_image", "missing_caption")
CONVERSION_KINDS = ("grayscale", "palette", "alpha", "sixteen_bit", "cmyk", "colorspace", "exif_orientation")
OTHER_KINDS = ("bad_metadata", "ignored_member")
KINDS = frozenset(SKIP_KINDS + CONVERSION_KINDS + OTHER_KINDS)


def _member_extension(fname: str) -> str:
    base = fname.rsplit("/", 1)[-1]
    return base.split(".", 1)[1].lower() if "." in base else ""


class SampleCounter:
    """Per-process counts of skipped, converted and odd samples, with rate-limited logging."""

    def __init__(self, name: str = "stream"):
        self.name = name
        self.delta: collections.Counter = collections.Counter()
        self.total: collections.Counter = collections.Counter()

    def count(self, kind: str, detail: str = "") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown sample kind {kind!r}")
        self.delta[kind] += 1
        self.total[kind] += 1
        n = self.total[kind]
        if n & (n - 1) == 0:  # log the 1st, 2nd, 4th, 8th, ... occurrence of each kind
            log.warning("%s: %s #%d %s", self.name, kind, n, detail[:300])

    def select(self, fname: str) -> bool:
        """Tar member filter: only images, captions and metadata are read; anything else (a .pyd pickle,
        say) is counted and skipped without reading its bytes."""
        if _member_extension(fname) in EXPECTED:
            return True
        self.count("ignored_member", fname)
        return False

    def take(self) -> dict[str, int]:
        """Counts since the previous call (what a batch carries)."""
        out, self.delta = dict(self.delta), collections.Counter()
        return out

    def open_failed(self, exn: Exception) -> bool:
        """webdataset handler for shards that cannot be opened: count, continue (no sleep, no re-raise)."""
        self.count("unreadable_shard", f"{type(exn).__name__}: {exn}")
        return True


class TarSamples:
    """Read tar shards into samples {__key__, __url__, ext: bytes} — whole samples only.

    Replaces webdataset's tarfile_to_samples, which yields the half-read sample of a truncated shard (with
    `ignore_and_continue`), reports one truncation twice, and keeps going after a duplicate member. Here a
    shard that breaks off drops its unfinished sample and counts one `truncated_tar`; a sample with a
    duplicated member is dropped whole; members that are not image, caption or metadata are never read.
    """

    def __init__(self, counter: SampleCounter):
        self.counter = counter

    def __call__(self, src):
        for source in wds.tariterators.url_opener(src, handler=self.counter.open_failed):
            url, stream = source["url"], source["stream"]
            current = None
            try:
                with tarfile.open(fileobj=stream, mode="r|*") as tar:
                    for info in tar:
                        if not info.isreg() or not self.counter.select(info.name):
                            continue
                        key, ext = wds.tariterators.base_plus_ext(info.name)
                        if key is None:
                            continue
                        if current is None or key != current["__key__"]:
                            if current is not None and self._complete(current):
                                yield current
                            current = {"__key__": key, "__url__": url}
                        ext = ext.lower()
                        if ext in current:
                            current["__duplicate__"] = ext
                        current[ext] = tar.extractfile(info).read()
                if current is not None and self._complete(current):
                    yield current
            except (tarfile.TarError, EOFError, OSError) as e:
                self.counter.count("truncated_tar", f"{url}: {type(e).__name__}: {e} (dropped "
                                                    f"{current['__key__'] if current else 'no'} partial sample)")
            finally:
                stream.close()

    def _complete(self, sample: dict) -> bool:
        if "__duplicate__" in sample:
            self.counter.count("duplicate_member", f"{sample['__key__']}.{sample['__duplicate__']} in "
                                                   f"{sample['__url__']}")
            return False
        return True


class WorkerShuffle:
    """A shuffle buffer seeded by (seed, rank, worker, epoch): reproducible, and different in every worker.

    webdataset's own `shuffle` is seeded by pid and time unless given a seed, and a fixed seed would give
    every worker and epoch the same order.
    """

    def __init__(self, bufsize: int, seed: int):
        self.bufsize, self.seed, self.epoch = bufsize, seed, -1

    def __call__(self, src):
        self.epoch += 1
        rng = random.Random(make_seed(pytorch_worker_seed(), self.epoch, self.seed, 7919))
        return wds.shuffle(self.bufsize, initial=min(self.bufsize, 100), rng=rng)(src)



class DecodeSamples:
    """Turn raw tar samples into checked training samples; bad ones are counted and dropped whole."""

    def __init__(self, counter: SampleCounter, image_size: int, ratios: tuple[int, ...], max_pixels: int):
        self.counter, self.image_size, self.ratios, self.max_pixels = counter, image_size, ratios, max_pixels

    def __call__(self, src):
        for sample in src:
            try:
                yield self.decode(sample)
            except BadSample as e:
                self.counter.count(e.kind, f"{sample.get('__key__')} in {sample.get('__url__')}: {e}")

    def decode(self, sample: dict) -> dict:
        data = next((sample[e] for e in IMAGE_EXTENSIONS if e in sample), None)
        if data is None:
            raise BadSample("missing_image", "no image member")
        raw_caption = sample.get("txt")
        try:
            caption = raw_caption.decode("utf-8").strip() if raw_caption is not None else ""
        except UnicodeDecodeError:
            caption = ""
        if not caption:
            raise BadSample("missing_caption", "missing, empty or undecodable caption")
        image, conversions = load_rgb(data, self.max_pixels)
        for conversion in conversions:
            self.counter.count(conversion, f"{sample.get('__key__')}")
        meta = {}
        if "json" in sample:
            try:
                meta = json.loads(sample["json"])
                if not isinstance(meta, dict):
                    raise ValueError("metadata is not an object")
            except (ValueError, UnicodeDecodeError) as e:
                self.counter.count("bad_metadata", f"{sample.get('__key__')}: {e}")
                meta = {}
        high = square_resize(image, self.image_size)
        return {"key": sample["__key__"], "caption": caption, "meta": meta, "image": to_tensor(high),
                "low": {r: to_tensor(downsample(high, r)) for r in self.ratios}}


class SkipBatches:
    """Drop the samples of the first `batches` batches a DataLoader already delivered (exact resume).

    A DataLoader with W workers delivers batches round-robin (batch k comes from worker k mod W), and each
    worker's stream is a pure function of (seed, rank, worker), so worker w skips its share of the batches
    and the resumed stream continues exactly where the interrupted one stopped. The resumed DataLoader
    starts its round-robin at worker 0, so `LogicalWorkers` renumbers the workers to start at N mod W.
    """

    def __init__(self, batches: int, batch_size: int):
        self.batches, self.batch_size = batches, batch_size

    def __call__(self, src):
        _, _, worker, workers = pytorch_worker_info()
        mine = self.batches // workers + (1 if worker < self.batches % workers else 0)
        for i, sample in enumerate(src):
            if i >= mine * self.batch_size:
                yield sample


class LogicalWorkers:
    """DataLoader worker_init_fn: worker i reads the stream of worker (i + offset) mod W.

    webdataset (and every stage here) takes the worker's identity from the WORKER / NUM_WORKERS environment
    variables when they are set, so this renumbering reaches shard sampling, shuffling and skipping alike.
    """

    def __init__(self, offset: int, workers: int):
        self.offset, self.workers = offset, workers

    def __call__(self, worker_id: int) -> None:
        os.environ["WORKER"] = str((worker_id + self.offset) % self.workers)
        os.environ["NUM_WORKERS"] = str(self.workers)


def collate(samples: list[dict]) -> dict:
    rank, _, worker, _ = pytorch_worker_info()
    return {"key": [s["key"] for s in samples], "caption": [s["caption"] for s in samples],
            "meta": [s["meta"] for s in samples],
            "image": torch.stack([s["image"] for s in samples]),
            "low": {r: torch.stack([s["low"][r] for s in samples]) for r in samples[0]["low"]},
            "source": (rank, worker)}


class Batches:
    """Samples -> batches, each carrying this process's counter deltas under "bad".

    Without `partial` the stream's last, incomplete batch is dropped, but what was counted while reading it
    (the faults among its samples and after them) must not be: every batch is held back until the next one
    is complete, so the last batch delivered carries the counts up to the end of the stream. A process that
    never fills one batch has nothing to carry them on and logs them instead.
    """

    def __init__(self, batch_size: int, counter: SampleCounter, partial: bool):
        self.batch_size, self.counter, self.partial = batch_size, counter, partial

    def __call__(self, src):
        held, samples = None, []
        for sample in src:
            samples.append(sample)
            if len(samples) == self.batch_size:
                if held is not None:
                    yield self._counted(held)
                held, samples = collate(samples), []
        if samples and self.partial:
            if held is not None:
                yield self._counted(held)
            held = collate(samples)
        if held is not None:
            yield self._counted(held)
        elif self.counter.delta:
            log.warning("%s: no complete batch; its counts go unreported in the batches: %s", self.counter.name,
                        self.counter.take())

    def _counted(self, batch: dict) -> dict:
        return batch | {"bad": self.counter.take()}


def build_pipeline(urls, *, image_size: int, ratios, batch_size: int, seed: int, shuffle_buffer: int,
                   resampled: bool, max_pixels: int, partial: bool, name: str = "stream",
                   skip_batches: int = 0) -> wds.DataPipeline:
    """The full shard -> batch pipeline. `urls`: list or brace pattern of paths, `pipe:` commands, http(s)."""
    counter = SampleCounter(name)
    if resampled:  # infinite, with replacement, seeded per (rank, worker, epoch)
        stages = [wds.ResampledShards(urls, seed=seed, deterministic=True)]
    else:  # each shard once per epoch, split over ranks then workers
        stages = [wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker]
    stages.append(TarSamples(counter))
    if shuffle_buffer > 0:
        stages.append(WorkerShuffle(shuffle_buffer, seed))
    stages.append(DecodeSamples(counter, image_size, tuple(ratios), max_pixels))
    if skip_batches:
        stages.append(SkipBatches(skip_batches, batch_size))
    stages.append(Batches(batch_size, counter, partial))
    return wds.DataPipeline(*stages)


class StreamStats:
    """Sums the per-batch counter deltas of every worker (what was skipped, converted or ignored)."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.samples = 0

    def update(self, batch: dict) -> None:
        self.counts.update(batch.get("bad", {}))
        self.samples += len(batch["key"])

    @property
    def skipped(self) -> int:
        return sum(self.counts[k] for k in SKIP_KINDS)

    def summary(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.counts.items()) if v]
        return f"{self.samples} samples, {self.skipped} skipped" + (f" ({', '.join(parts)})" if parts else "")
