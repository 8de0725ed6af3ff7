"""LAION-COCO-Aesthetic (or any URL + caption list) -> webdataset shards at the training resolution, with
img2dataset: `python -m mulosd.data.laion --url-list FILE.parquet --out data/shards/laion_coco_aesthetic`.

img2dataset pins webdataset<0.3 while this project streams with webdataset 1.0, so it runs as a command
from its own virtual environment (`.venv-img2dataset`, made on first use with `pip install img2dataset`).
Its shards hold `<key>.jpg`, `<key>.txt` (the caption) and `<key>.json` per sample: the layout the stream
reads. Images are resized to the training resolution (shorter side, then a centre crop), so training
decodes small JPEGs instead of full-size photos; failed downloads are counted by img2dataset and listed in
the summary printed at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ..paths import IMG2DATASET_ENV

IMG2DATASET = "img2dataset==1.47.0"


def ensure_env(env: Path = IMG2DATASET_ENV) -> Path:
    """The isolated environment's img2dataset executable (created, then installed into, on first use)."""
    exe = env / "bin" / "img2dataset"
    if not exe.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", IMG2DATASET], check=True)
    return exe


def command(exe: Path, url_list: Path, out: Path, image_size: int, input_format: str, url_col: str,
            caption_col: str, processes: int, threads: int, per_shard: int) -> list[str]:
    return [str(exe), "--url_list", str(url_list), "--input_format", input_format, "--url_col", url_col,
            "--caption_col", caption_col, "--output_format", "webdataset", "--output_folder", str(out),
            "--image_size", str(image_size), "--resize_mode", "center_crop", "--resize_only_if_bigger", "False",
            "--encode_format", "jpg", "--encode_quality", "95", "--processes_count", str(processes),
            "--thread_count", str(threads), "--number_sample_per_shard", str(per_shard),
            "--distributor", "multiprocessing", "--enable_wandb", "False", "--retries", "1"]


def summary(out: Path) -> dict:
    """img2dataset's per-shard stats, summed: count, successes, failed_to_download, failed_to_resize."""
    total = {"shards": 0, "count": 0, "successes": 0, "failed_to_download": 0, "failed_to_resize": 0}
    for stats in sorted(Path(out).glob("*_stats.json")):
        s = json.loads(stats.read_text())
        total["shards"] += 1
        for k in ("count", "successes", "failed_to_download", "failed_to_resize"):
            total[k] += int(s.get(k, 0))
    return total


def prepare(url_list: Path, out: Path, image_size: int = 256, input_format: str = "parquet", url_col: str = "URL",
            caption_col: str = "TEXT", processes: int = 4, threads: int = 32, per_shard: int = 10000,
            env: Path = IMG2DATASET_ENV) -> dict:
    if not Path(url_list).is_file():
        raise FileNotFoundError(f"no URL list at {url_list}")
    exe = ensure_env(env)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(command(exe, url_list, out, image_size, input_format, url_col, caption_col, processes, threads,
                           per_shard), check=True)
    return summary(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mulosd.data.laion", description=__doc__.splitlines()[0])
    p.add_argument("--url-list", type=Path, required=True, help="parquet (or csv / txt) of URLs and captions")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--image-size", type=int, default=256, help="the training resolution")
    p.add_argument("--input-format", default="parquet", choices=("parquet", "csv", "tsv", "txt"))
    p.add_argument("--url-col", default="URL")
    p.add_argument("--caption-col", default="TEXT")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--threads", type=int, default=32)
    p.add_argument("--per-shard", type=int, default=10000)
    a = p.parse_args(argv)
    try:
        s = prepare(a.url_list, a.out, a.image_size, a.input_format, a.url_col, a.caption_col, a.processes,
                    a.threads, a.per_shard)
    except (FileNotFoundError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"laion: {s['successes']}/{s['count']} images in {s['shards']} shards ({s['failed_to_download']} failed "
          f"to download, {s['failed_to_resize']} failed to resize) -> {a.out}")
    print(f'train with: python train.py data=laion_coco_aesthetic "data.train_urls=\'{a.out}/'
          '{00000..NNNNN}.tar\'" data.image_size=' + str(a.image_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
