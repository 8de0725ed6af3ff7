"""The LAION-COCO-Aesthetic preparation end to end: img2dataset (in its own environment) downloads from a
parquet of URLs served on 127.0.0.1, writes shards at the training resolution, and the DataModule streams them."""

import functools
import http.server
import json
import subprocess
import threading

import pytest
from PIL import Image

from mulosd.data.datamodule import ShardDataModule
from mulosd.data.laion import ensure_env, prepare
from mulosd.data.stream import StreamStats
from mulosd.data.synthscenes import caption_text, render, sample_scene

from .conftest import ROOT


@pytest.fixture
def served(tmp_path):
    """12 scene renders (landscape, 96 x 64) and their captions, one missing file and one corrupt image."""
    www = tmp_path / "www"
    www.mkdir()
    rows = []
    for i in range(12):
        scene = sample_scene(77, i)
        im = render(scene, 96)[16:80]  # 64 rows of a 96 px render: not square
        Image.fromarray(im).save(www / f"{i}.png")
        rows.append((f"{i}.png", caption_text(scene.prompt)))
    (www / "broken.png").write_bytes(b"\x89PNG not really")
    rows += [("missing.png", "a file the server does not have"), ("broken.png", "bytes that are not an image")]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [(f"http://127.0.0.1:{server.server_port}/{name}", cap) for name, cap in rows]
    server.shutdown()


@pytest.mark.slow
def test_prepare_downloads_resizes_and_streams_through_the_datamodule(served, tmp_path):
    env = ROOT / ".venv-img2dataset"
    ensure_env(env)
    parquet = tmp_path / "urls.parquet"
    script = ("import json, sys, pandas as pd; rows = json.loads(sys.argv[2]); "
              "pd.DataFrame({'URL': [u for u, _ in rows], 'TEXT': [c for _, c in rows]}).to_parquet(sys.argv[1])")
    subprocess.run([str(env / "bin" / "python"), "-c", script, str(parquet), json.dumps(served)], check=True)
    out = tmp_path / "shards"
    stats = prepare(parquet, out, image_size=64, processes=1, threads=4, per_shard=8, env=env)
    assert stats["count"] == 14 and stats["successes"] == 12, stats
    assert stats["failed_to_download"] + stats["failed_to_resize"] == 2, stats

    shards = sorted(out.glob("*.tar"))
    dm = ShardDataModule(train_urls=[str(p) for p in shards], val_urls=[str(p) for p in shards], image_size=64,
                         ratios=[2], batch_size=4, num_workers=0, shuffle_buffer=0, resampled=False,
                         batches_per_epoch=0, val_batches=0, max_image_pixels=10**7, seed=0, synth=None)
    seen, counts = {}, StreamStats()
    for batch in dm.val_dataloader():
        counts.update(batch)
        assert batch["image"].shape[1:] == (3, 64, 64) and batch["low"][2].shape[1:] == (3, 32, 32)
        for cap, meta in zip(batch["caption"], batch["meta"], strict=True):
            seen[meta["url"]] = cap
    want = dict(served[:12])
    assert seen == want and counts.skipped == 0
