"""Token grids of a shard set, computed once per tokenizer and cached, for training the AR models.

Tokenising once beats tokenising on the fly here: every AR epoch would otherwise pay a VQ encoder forward
per image (measured in docs/guide.md, "AR backbone"). The cache holds, per split, the grids at the full size and at
each low-res ratio (so the 32, 64 and 128 px models share one pass), the captions and the sample keys. It is
keyed by the tokenizer's weights (SHA-256) and the shard URLs, so a retrained tokenizer never meets stale
tokens. Training batches are drawn from a seeded permutation per epoch; the batch counter is checkpointed,
so a resumed run continues with exactly the batches the interrupted one would have drawn.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lightning as L
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, IterableDataset
from tqdm import tqdm

from ..atomic import atomic_path, atomic_write_bytes
from ..data.datamodule import ShardDataModule
from ..data.stream import StreamStats, build_pipeline
from ..zoo import load_tokenizer, tokenizer_digest, tokenizer_identity


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@torch.no_grad()
def tokenize_split(tokenizer, urls: str, image_size: int, ratios, out: Path, batch_size: int = 64) -> Path:
    """One ordered pass over the shards -> out.safetensors (tokens{size}: int16 [N, g, g]) + out.json.
    Where every sample's metadata holds its SynthScenes scene, also objects{size}: uint8 [N, g, g], the
    tokens that hold an object (for the AR models' object-token loss weight)."""
    from ..data.synthscenes.render import object_mask
    from ..data.synthscenes.scene import Scene

    pipeline = build_pipeline(urls, image_size=image_size, ratios=ratios, batch_size=batch_size, seed=0,
                              shuffle_buffer=0, resampled=False, max_pixels=64_000_000, partial=True,
                              name="tokenize")
    grids: dict[int, list[torch.Tensor]] = {}
    masks: dict[int, list[torch.Tensor]] | None = {}
    captions, keys, stats = [], [], StreamStats()
    device = next(tokenizer.parameters()).device
    for batch in tqdm(pipeline, desc=f"tokenising {Path(urls).name}", unit="batch"):
        views = [batch["image"]] + [batch["low"][r] for r in sorted(batch["low"])]
        if masks is not None and not all("scene" in m for m in batch["meta"]):
            masks = None  # not a SynthScenes shard set: no object masks for this split
        scenes = [Scene.from_dict(m["scene"]) for m in batch["meta"]] if masks is not None else []
        for x in views:
            t = tokenizer.encode(x.to(device)).to("cpu", torch.int16)
            grids.setdefault(x.shape[-1], []).append(t)
            if masks is not None:
                g = t.shape[-1]
                masks.setdefault(x.shape[-1], []).append(
                    torch.from_numpy(np.stack([object_mask(sc, g) for sc in scenes])).to(torch.uint8))
        captions += batch["caption"]
        keys += batch["key"]
        stats.update(batch)
    if not captions:
        raise ValueError(f"no samples in {urls}")
    tensors = {f"tokens{s}": torch.cat(g) for s, g in grids.items()}
    tensors |= {f"objects{s}": torch.cat(m) for s, m in (masks or {}).items()}
    meta = {"captions": captions, "keys": keys, "stream": stats.summary()}
    atomic_write_bytes(Path(str(out) + ".json"), json.dumps(meta).encode())  # first: the safetensors marks completion
    with atomic_path(Path(str(out) + ".safetensors")) as tmp:
        save_file(tensors, str(tmp))
    return out


class TokenBatches(IterableDataset):
    """Endless batches {tokens: {px: [B, g, g] long}, caption [B], objects: {px: [B, g, g] bool} where known}
    from a seeded permutation per epoch, starting at global batch `start` (a resumed run's counter). Every
    size in `tokens` holds the same scenes (a multi-resolution model trains on their grids together)."""

    def __init__(self, tokens: dict[int, torch.Tensor], captions: list[str], batch_size: int, seed: int,
                 start: int = 0, objects: dict[int, torch.Tensor] | None = None):
        if len(captions) < batch_size:
            raise ValueError(f"{len(captions)} samples cannot fill one batch of {batch_size}")
        self.tokens, self.captions, self.objects = tokens, captions, objects
        self.batch_size, self.seed, self.start = batch_size, seed, start
        self.per_epoch = len(captions) // batch_size

    def __iter__(self):
        b = self.start
        while True:
            epoch, i = divmod(b, self.per_epoch)
            perm = torch.randperm(len(self.captions), generator=torch.Generator().manual_seed(self.seed + epoch))
            idx = perm[i * self.batch_size:(i + 1) * self.batch_size]
            yield _batch(self.tokens, self.captions, self.objects, idx)
            b += 1


def _batch(tokens: dict[int, torch.Tensor], captions: list[str], objects: dict[int, torch.Tensor] | None,
           idx: torch.Tensor) -> dict:
    out = {"tokens": {s: t[idx].long() for s, t in tokens.items()}, "caption": [captions[j] for j in idx.tolist()]}
    if objects is not None:
        out["objects"] = {s: m[idx].bool() for s, m in objects.items()}
    return out


class TokenDataModule(L.LightningDataModule):
    """The cached grids of the image sizes `sizes` (px), batched together by scene."""

    def __init__(self, shards: ShardDataModule, tokenizer: str, sizes: list[int], batch_size: int, seed: int,
                 val_batches: int = 4, cache_dir: str | Path = "data/tokens"):
        super().__init__()
        self.shards, self.tokenizer_name, self.sizes = shards, tokenizer, [int(s) for s in sizes]
        self.batch_size, self.seed, self.val_batches = batch_size, seed, val_batches
        self.cache_dir = Path(cache_dir)
        self.train_batches = self.skip_batches = 0
        self.data: dict[str, tuple[dict[int, torch.Tensor], list[str], dict[int, torch.Tensor] | None]] = {}

    def _path(self, split: str, urls: str) -> Path:
        tok = tokenizer_digest(tokenizer_identity(self.tokenizer_name))
        ratios = ",".join(map(str, self.shards.ratios))
        # "objects": caches written before object masks existed are rebuilt, not read without them
        return self.cache_dir / tok / f"{split}-{_digest(urls, str(self.shards.image_size), ratios, 'objects')}"

    def _splits(self) -> dict[str, str]:
        return {k: v for k, v in (("train", self.shards.train_urls), ("val", self.shards.val_urls)) if v}

    def prepare_data(self) -> None:
        self.shards.prepare_data()
        todo = {s: u for s, u in self._splits().items() if not Path(str(self._path(s, u)) + ".safetensors").exists()}
        if todo:
            # on a GPU machine the encoder runs there (tokenising is most of a GPU run's data preparation)
            tok = load_tokenizer(self.tokenizer_name, device="cuda" if torch.cuda.is_available() else "cpu").eval()
            for split, urls in todo.items():
                tokenize_split(tok, urls, self.shards.image_size, self.shards.ratios, self._path(split, urls))

    def setup(self, stage=None) -> None:
        for split, urls in self._splits().items():
            path = self._path(split, urls)
            tensors = load_file(str(path) + ".safetensors")
            for size in self.sizes:
                if f"tokens{size}" not in tensors:
                    raise ValueError(f"no {size} px tokens in {path} (has {', '.join(sorted(tensors))}): set "
                                     f"data.image_size / data.ratios so that {size} px is among the views")
            meta = json.loads(Path(str(path) + ".json").read_text())
            objects = {s: tensors[f"objects{s}"] for s in self.sizes if f"objects{s}" in tensors}
            self.data[split] = ({s: tensors[f"tokens{s}"] for s in self.sizes}, meta["captions"],
                                objects if len(objects) == len(self.sizes) else None)

    @property
    def has_objects(self) -> bool:
        """Whether every split knows which tokens hold objects (SynthScenes shards do)."""
        return bool(self.data) and all(v[2] is not None for v in self.data.values())

    def summary(self) -> str:
        n = {k: len(v[1]) for k, v in self.data.items()}
        px = " + ".join(f"{s} px" for s in self.sizes)
        return f"{self.train_batches} batches from {n.get('train', 0)} tokenised scenes ({px})"

    def state_dict(self) -> dict:
        return {"train_batches": self.train_batches}

    def load_state_dict(self, state: dict) -> None:
        self.train_batches = self.skip_batches = int(state["train_batches"])

    def train_dataloader(self):
        tokens, captions, objects = self.data["train"]
        ds = TokenBatches(tokens, captions, self.batch_size, self.seed, start=self.skip_batches, objects=objects)
        return DataLoader(ds, batch_size=None, num_workers=0)

    def val_dataloader(self):
        if "val" not in self.data:
            return []
        tokens, captions, objects = self.data["val"]
        n = min(len(captions), self.val_batches * self.batch_size)
        return DataLoader([_batch(tokens, captions, objects, torch.arange(i, min(i + self.batch_size, n)))
                           for i in range(0, n, self.batch_size)], batch_size=None)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        if self.trainer is not None and self.trainer.training:
            self.train_batches += 1
        return batch
