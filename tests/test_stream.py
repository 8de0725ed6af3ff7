import io
import json
import pickle
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from mulosd.data.datamodule import ShardDataModule
from mulosd.data.images import square_resize, to_image
from mulosd.data.stream import StreamStats, build_pipeline
from mulosd.data.synthscenes import caption_text, parse_caption, render
from mulosd.data.synthscenes.scene import Scene


def _encode(im: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def _write_tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _rgb(seed=0, size=48):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8))


class _Payload:
    """Unpickling this creates a marker file: proof that a pickle was executed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture
def fuzzed(tmp_path):
    marker = tmp_path / "pwned"
    cap = b"a red circle"
    rgba = np.zeros((48, 48, 4), np.uint8)
    rgba[..., 0] = 255  # hidden red under alpha 0 on the left half
    rgba[:, 24:, :] = (0, 0, 255, 255)
    cmyk = Image.new("CMYK", (48, 48), (0, 255, 255, 0))
    members = [
        ("k00.png", _encode(_rgb(0))), ("k00.txt", cap), ("k00.json", b'{"w": 48}'),
        ("k01.jpg", b"this is not an image"), ("k01.txt", cap),
        ("k02.txt", cap),
        ("k03.png", _encode(_rgb(3))),
        ("k04.png", _encode(_rgb(4))), ("k04.txt", b"   \n"),
        ("k05.png", _encode(_rgb(5).convert("L"))), ("k05.txt", cap),
        ("k06.png", _encode(Image.fromarray(rgba, "RGBA"))), ("k06.txt", cap),
        ("k07.png", _encode(Image.fromarray(np.full((48, 48), 32896, np.uint16)))), ("k07.txt", cap),
        ("k08.jpg", _encode(cmyk, "JPEG")), ("k08.txt", cap),
        ("k09.png", _encode(_rgb(9).convert("P"))), ("k09.txt", cap),
        ("k10.png", _encode(_rgb(10))), ("k10.txt", cap), ("k10.pyd", pickle.dumps(_Payload(marker))),
        ("k11.png", _encode(_rgb(11, size=400))), ("k11.txt", cap),
        ("k12.png", _encode(_rgb(12))), ("k12.txt", cap), ("k12.json", b"{not json"),
    ]
    _write_tar(tmp_path / "f0.tar", members)
    full = tmp_path / "f1_full.tar"
    _write_tar(full, [m for i in range(4) for m in ((f"t{i}.png", _encode(_rgb(20 + i))), (f"t{i}.txt", cap))])
    data = full.read_bytes()
    (tmp_path / "f1.tar").write_bytes(data[: int(len(data) * 0.6)])
    urls = [str(tmp_path / "f0.tar"), str(tmp_path / "f1.tar"), str(tmp_path / "missing.tar")]
    return urls, marker


def _stream(urls, **kw):
    args = dict(image_size=32, ratios=(2, 4), batch_size=3, seed=0, shuffle_buffer=0, resampled=False,
                max_pixels=100_000, partial=True)
    args.update(kw)
    stats, batches = StreamStats(), []
    for batch in build_pipeline(urls, **args):
        stats.update(batch)
        batches.append(batch)
    return batches, stats


def test_fuzzed_shards_are_counted_per_kind_and_never_leak(fuzzed):
    urls, marker = fuzzed
    batches, stats = _stream(urls)
    keys = [k for b in batches for k in b["key"]]
    assert not marker.exists(), "a pickle member was executed"
    c = stats.counts
    assert (c["corrupt_image"], c["missing_image"], c["missing_caption"], c["too_large"]) == (1, 1, 2, 1)
    assert (c["grayscale"], c["alpha"], c["sixteen_bit"], c["cmyk"], c["palette"]) == (1, 1, 1, 1, 1)
    assert (c["ignored_member"], c["bad_metadata"], c["unreadable_shard"]) == (1, 1, 1)
    assert c["truncated_tar"] == 1
    assert set(keys) >= {"k00", "k05", "k06", "k07", "k08", "k09", "k10", "k12", "t0"}
    assert not set(keys) & {"k01", "k02", "k03", "k04", "k11"}
    assert len(keys) == len(set(keys)) == stats.samples
    for b in batches:  # no partial sample: every one has every field, with the right shapes
        n = len(b["key"])
        assert b["image"].shape == (n, 3, 32, 32) and b["low"][2].shape == (n, 3, 16, 16)
        assert b["low"][4].shape == (n, 3, 8, 8) and all(b["caption"])
        assert b["image"].min() >= -1 and b["image"].max() <= 1
    by_key = {k: to_image(b["image"][i]) for b in batches for i, k in enumerate(b["key"])}
    assert abs(by_key["k07"].mean() - 128) <= 1  # 16-bit mid grey, not saturated white
    left = by_key["k06"][:, :14]
    assert left.min() >= 250, "transparent pixels must be composited onto white, not show hidden red"
    cmyk = by_key["k08"].reshape(-1, 3).mean(0)
    assert cmyk[0] > 200 and cmyk[1] < 60 and cmyk[2] < 60  # C=0 M=Y=255 is red


def test_the_dropped_last_partial_batch_keeps_its_fault_counts(tmp_path):
    """Seven good samples in batches of 3 without partial batches: the seventh is dropped with its batch, and
    the faults read after it (a corrupt image, a missing caption) must still be counted."""
    cap = b"a red circle"
    members = [m for i in range(7) for m in ((f"g{i}.png", _encode(_rgb(i))), (f"g{i}.txt", cap))]
    members += [("b0.jpg", b"not an image"), ("b0.txt", cap), ("b1.png", _encode(_rgb(7)))]
    _write_tar(tmp_path / "s.tar", members)
    batches, stats = _stream([str(tmp_path / "s.tar")], partial=False)
    assert [len(b["key"]) for b in batches] == [3, 3]
    assert (stats.counts["corrupt_image"], stats.counts["missing_caption"], stats.samples) == (1, 1, 6)


def _with_orientation(im: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95, exif=exif)
    return buf.getvalue()


@pytest.mark.parametrize("orientation, turn", [(6, Image.Transpose.ROTATE_270), (3, Image.Transpose.ROTATE_180),
                                               (8, Image.Transpose.ROTATE_90), (2, Image.Transpose.FLIP_LEFT_RIGHT)])
def test_exif_orientation_is_applied_and_counted(tmp_path, orientation, turn):
    """A camera stores the sensor's pixels and says how to turn them; an image read without turning it
    arrives on its side. Stored: a red top half; shown as the tag says: red on the side it turns to."""
    stored = np.zeros((64, 64, 3), np.uint8)
    stored[:32, :48] = (255, 0, 0)  # red top-left block, so every turn and mirror is distinguishable
    stored[32:] = (0, 0, 255)
    upright = np.asarray(Image.fromarray(stored).transpose(turn))
    shown, plain = (_with_orientation(Image.fromarray(stored), o) for o in (orientation, 1))
    _write_tar(tmp_path / "e.tar", [("e.jpg", shown), ("e.txt", b"a red circle"), ("u.jpg", plain),
                                    ("u.txt", b"a red circle")])
    batches, stats = _stream([str(tmp_path / "e.tar")], image_size=64, batch_size=2)
    got = {k: to_image(batches[0]["image"][i]).astype(int) for i, k in enumerate(batches[0]["key"])}
    assert np.abs(got["e"] - upright).mean() < 8 and np.abs(got["u"] - stored).mean() < 8
    assert stats.counts["exif_orientation"] == 1


def test_stream_round_trips_synthscenes_shards(synth_shards):
    urls = str(synth_shards / "train-{00000..00001}.tar")
    batches, stats = _stream(urls, image_size=64, batch_size=8, max_pixels=10**7)
    assert stats.samples == 32 and stats.skipped == 0
    for b in batches:
        for i, meta in enumerate(b["meta"]):
            scene = Scene.from_dict(meta["scene"])
            assert b["caption"][i] == meta["caption"] == caption_text(scene.prompt)
            assert parse_caption(b["caption"][i]) == scene.prompt
            assert np.array_equal(to_image(b["image"][i]), render(scene, 64))  # png: lossless
            low = to_image(b["low"][2][i]).astype(int)
            assert np.abs(low - render(scene, 32).astype(int)).mean() < 6  # antialiased resize of the same scene


def test_raw_shard_members_match_a_laion_layout(synth_shards):
    sample = next(iter(wds.WebDataset(str(synth_shards / "train-00000.tar"), shardshuffle=False)))
    assert {k for k in sample if not k.startswith("__")} == {"png", "txt", "json"}
    meta = json.loads(sample["json"])
    assert {"caption", "width", "height"} <= set(meta)


def _keys(dm, n_batches):
    out = []
    for i, b in enumerate(dm.train_dataloader()):
        out.append((b["source"], tuple(b["key"])))
        if i + 1 >= n_batches:
            break
    return out


def _dm(urls, seed, workers):
    return ShardDataModule(train_urls=urls, val_urls=urls, image_size=64, ratios=[2, 4], batch_size=4,
                           num_workers=workers, shuffle_buffer=16, resampled=True, batches_per_epoch=6,
                           val_batches=0, max_image_pixels=10**7, seed=seed)


def test_resampled_stream_is_reproducible_and_distinct_per_worker(synth_shards):
    urls = str(synth_shards / "train-{00000..00001}.tar")
    a, b = _keys(_dm(urls, 0, 2), 6), _keys(_dm(urls, 0, 2), 6)
    assert a == b
    assert _keys(_dm(urls, 1, 2), 6) != a
    per_worker = {}
    for (_rank, worker), keys in a:
        per_worker.setdefault(worker, []).extend(keys)
    assert set(per_worker) == {0, 1}
    assert per_worker[0] != per_worker[1]


def test_datamodule_validation_sees_every_sample_once(synth_shards):
    urls = str(synth_shards / "train-{00000..00001}.tar")
    dm = _dm(urls, 0, 2)
    keys = [k for b in dm.val_dataloader() for k in b["key"]]
    assert len(keys) == 32 and len(set(keys)) == 32


def test_datamodule_keeps_counts_out_of_the_batch(synth_shards):
    dm = _dm(str(synth_shards / "train-00000.tar"), 0, 0)
    batch = next(iter(dm.train_dataloader()))
    out = dm.on_after_batch_transfer(batch, 0)
    assert "bad" not in out and dm.stats["train"].samples == 4 and dm.stats["val"].samples == 0
    assert isinstance(out["image"], torch.Tensor)


def test_square_resize_crops_the_centre():
    img = np.zeros((100, 200, 3), np.uint8)
    img[:, 50:150] = 255
    out = square_resize(img, 50)
    assert out.shape == (50, 50, 3) and out.mean() > 250
