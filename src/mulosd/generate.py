"""Prompt files decoded across devices: `python infer.py prompt_file=prompts.txt devices=N`.

Lightning's predict loop runs one process per device (DDP; gloo on CPU, NCCL on GPU). Each rank loads the
models once, decodes its share of the prompts with the configured strategy, and writes every image under its
global index (`000.png`, ...) with its trace; image i is decoded with image id i, so it is the same image
whatever the number of devices or the batch it lands in (the sampling noise is keyed by image id). Rank 0
then gathers the files in prompt order into the grid and the summary. DistributedSampler pads the last
batches by repeating prompts; a repeat rewrites the same file with the same image.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from .pipeline import Pipeline


class Prompts(Dataset):
    def __init__(self, texts: list[str]):
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[int, str]:
        return i, self.texts[i]


def _collate(items):
    return torch.tensor([i for i, _ in items]), [t for _, t in items]


class Decoder(L.LightningModule):
    """Holds no trainable state: the models live in a `Pipeline`, loaded on each rank in setup()."""

    def __init__(self, cfg: DictConfig):
        super().__init__()
        self.cfg = cfg
        self.pipe: Pipeline | None = None

    def setup(self, stage: str) -> None:
        self.pipe = Pipeline.from_config(self.cfg, {self.cfg.decoding})

    def predict_step(self, batch, batch_idx):
        ids, texts = batch
        tokens, trace = self.pipe.decode(self.cfg.decoding, self.cfg, texts, ids.cpu())
        return ids.tolist(), self.pipe.images(tokens), trace


class ImageWriter(BasePredictionWriter):
    def __init__(self, out_dir: Path):
        super().__init__(write_interval="batch")
        self.out_dir = out_dir

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        ids, images, trace = prediction
        for i, image in zip(ids, images, strict=True):
            Image.fromarray(image).save(self.out_dir / f"{i:03d}.png")
        record = {"ids": ids, "rank": trainer.global_rank, "steps": trace.steps, "wall_s": trace.wall_s,
                  "forwards": trace.forwards, "counts": trace.counts}
        (self.out_dir / f"trace_{ids[0]:03d}.json").write_text(json.dumps(record) + "\n")


def generate(cfg: DictConfig, texts: list[str], out_dir: Path) -> dict | None:
    """Decode `texts` on cfg.devices devices; on rank 0 returns the gathered images (in prompt order) and the
    summed trace figures, elsewhere None."""
    accelerator = "gpu" if cfg.device == "cuda" else "cpu"
    trainer = L.Trainer(accelerator=accelerator, devices=cfg.devices, strategy="ddp" if cfg.devices > 1 else "auto",
                        logger=False, enable_checkpointing=False, callbacks=[ImageWriter(out_dir)],
                        enable_progress_bar=True, default_root_dir=out_dir)
    loader = DataLoader(Prompts(texts), batch_size=cfg.batch_size, shuffle=False, collate_fn=_collate)
    trainer.predict(Decoder(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))), loader,
                    return_predictions=False)
    trainer.strategy.barrier()  # every rank's files are written before rank 0 gathers them
    if trainer.global_rank != 0:
        return None
    images = [np.asarray(Image.open(out_dir / f"{i:03d}.png")) for i in range(len(texts))]
    traces = [json.loads(p.read_text()) for p in sorted(out_dir.glob("trace_*.json"))]
    per_rank: dict[int, float] = {}
    for t in traces:  # ranks decode their batches one after another, and run side by side
        per_rank[t["rank"]] = per_rank.get(t["rank"], 0.0) + t["wall_s"]
    return {"images": images, "traces": traces, "wall_s": max(per_rank.values()), "ranks": len(per_rank)}
