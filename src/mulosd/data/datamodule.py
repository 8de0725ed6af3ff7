"""LightningDataModule over webdataset shards (SynthScenes or LAION-COCO-Aesthetic)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import webdataset as wds

from .stream import LogicalWorkers, StreamStats, build_pipeline
from .synthscenes.shards import VAL_FIRST_INDEX, shard_pattern, write_split
from .synthscenes.vocab import RADIUS_RANGE


def synth_radius(synth) -> tuple[float, float]:
    """The object half-size range a SynthScenes recipe draws its scenes in (the world's default unless set)."""
    return tuple(synth.radius) if synth.get("radius") else RADIUS_RANGE


class ShardDataModule(L.LightningDataModule):
    """Streams batches of {image [B,3,S,S], low {r: [B,3,S/r,S/r]}, caption, key, meta} in [-1, 1].

    With `synth` set (a SynthScenes recipe), the shards are written on first use when missing, so a fresh
    clone trains without a preparation step. Otherwise `train_urls` / `val_urls` point at existing shards:
    local paths or brace patterns, `pipe:` commands or http(s) URLs.
    """

    def __init__(self, *, train_urls: str | None, val_urls: str | None, image_size: int, ratios,
                 batch_size: int, num_workers: int, shuffle_buffer: int, resampled: bool,
                 batches_per_epoch: int, val_batches: int, max_image_pixels: int, seed: int, synth=None):
        super().__init__()
        self.synth = synth
        if synth is not None:
            root = Path(synth.dir)
            train_urls = str(root / shard_pattern("train", synth.train_shards, synth.get("first_shard", 0)))
            val_urls = str(root / shard_pattern("val", synth.val_shards)) if synth.val_shards else None
        if not train_urls:
            raise ValueError("data.train_urls is empty: point it at your shards (see data/README.md)")
        self.train_urls, self.val_urls = train_urls, val_urls
        self.image_size, self.ratios = image_size, tuple(ratios)
        self.batch_size, self.num_workers = batch_size, num_workers
        self.shuffle_buffer, self.resampled = shuffle_buffer, resampled
        self.batches_per_epoch, self.val_batches = batches_per_epoch, val_batches
        self.max_image_pixels, self.seed = max_image_pixels, seed
        self.stats = {"train": StreamStats(), "val": StreamStats()}
        self.train_batches = 0  # batches handed to training_step so far (checkpointed, for exact resume)
        self.skip_batches = 0

    def prepare_data(self) -> None:
        """Write missing SynthScenes shards (rank 0 only, as Lightning calls it)."""
        if self.synth is None:
            return
        s = self.synth
        radius = synth_radius(s)
        write_split(Path(s.dir), "train", s.train_shards, s.per_shard, s.size, s.seed, image_format=s.image_format,
                    radius=radius, first_shard=s.get("first_shard", 0))
        if s.val_shards:
            write_split(Path(s.dir), "val", s.val_shards, s.per_shard, s.size, s.seed,
                        first_index=VAL_FIRST_INDEX, image_format=s.image_format, radius=radius)

    def _loader(self, urls: str, train: bool) -> wds.WebLoader:
        skip = self.skip_batches if train else 0
        pipeline = build_pipeline(urls, image_size=self.image_size, ratios=self.ratios,
                                  batch_size=self.batch_size, seed=self.seed,
                                  shuffle_buffer=self.shuffle_buffer if train else 0,
                                  resampled=self.resampled and train, max_pixels=self.max_image_pixels,
                                  partial=not train, name="train" if train else "val", skip_batches=skip)
        init = LogicalWorkers(skip % self.num_workers, self.num_workers) if self.num_workers > 0 else None
        loader = wds.WebLoader(pipeline, batch_size=None, num_workers=self.num_workers,
                               persistent_workers=train and self.num_workers > 0, worker_init_fn=init)
        n = self.batches_per_epoch if train else self.val_batches
        return loader.with_epoch(n) if n > 0 else loader

    def summary(self) -> str:
        return self.stats["train"].summary()

    def state_dict(self) -> dict:
        return {"train_batches": self.train_batches}

    def load_state_dict(self, state: dict) -> None:
        """On resume: the next train loader skips what the interrupted run's training steps consumed."""
        self.train_batches = self.skip_batches = int(state["train_batches"])

    def train_dataloader(self):
        return self._loader(self.train_urls, train=True)

    def val_dataloader(self):
        return self._loader(self.val_urls, train=False) if self.val_urls else []

    def on_after_batch_transfer(self, batch, dataloader_idx):
        """Keep the workers' bad-sample counts out of the model's batch and in `self.stats`."""
        split = "train" if self.trainer is None or self.trainer.training else "val"
        self.stats[split].update(batch)
        if split == "train":
            self.train_batches += 1
        batch.pop("bad", None)
        return batch
