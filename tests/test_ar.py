"""The AR backbone: KV cache against full forwards, scattered positions, batch independence, order-free
noise, classifier-free guidance, warpers, caption conditioning, and the zoo_ar recipes."""

import contextlib
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from mulosd.ar import ARBackbone, Transformer, TransformerConfig, Warpers, sample, warp
from mulosd.ar.backbone import guidance_scale, padded_writes
from mulosd.ar.noise import hash32, uniform
from mulosd.config.train import ARModelConfig, AROptimConfig, SampleConfig, ScheduleConfig
from mulosd.data.synthscenes import CaptionError, caption_text, sample_scene
from mulosd.data.synthscenes.encoder import SceneCaptionEncoder
from mulosd.decoding.ar import decode_ar

from .conftest import ROOT, assert_quiet_logs

CFG = TransformerConfig(vocab_size=48, grid=4, dim=32, layers=2, heads=2, cond_dim=16)


def _model(seed=0, cfg=CFG):
    torch.manual_seed(seed)
    model, enc = Transformer(cfg).double().eval(), SceneCaptionEncoder(cfg.cond_dim).double()
    with torch.no_grad():  # an untrained null condition equal in spirit to a trained one: distinct from any caption
        model.null_cond.normal_()
    return model, enc


def _captions(n, seed=0):
    return [caption_text(sample_scene(seed, i).prompt) for i in range(n)]


def test_kv_cached_decoding_equals_full_forward():
    model, enc = _model()
    caps = _captions(3)
    tokens = torch.randint(0, CFG.vocab_size, (3, 16))
    with torch.no_grad():
        full = model(tokens, enc(caps))
    bb = ARBackbone(model, enc)
    steps = [bb.start(caps)] + [bb(torch.full((3, 1), i), tokens[:, i:i + 1]) for i in range(15)]
    assert torch.allclose(torch.cat(steps, 1), full.float(), atol=1e-5)
    bb.start(caps)  # a whole block in one call gives the same logits
    assert torch.allclose(bb(torch.arange(15).expand(3, 15), tokens[:, :15]), full[:, 1:].float(), atol=1e-5)


def _reference(model, enc, caps, visible: list[int], tokens):
    """Causal forward over only the visible positions (no cache, no mask): logits at each visible slot."""
    P = model.cfg.prefix
    slots = torch.tensor(list(range(P)) + [P + p for p in visible])
    x = torch.cat([model.condition(enc(caps), len(caps)), model.embed(tokens[:, visible])], 1)
    rope = model.rope[slots][None, None]
    for block in model.blocks:
        x = block(x, rope)
    return model.head(model.norm(x))[:, P:]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scattered_positions_with_filled_mask_equal_full_forward_on_the_same_context(seed):
    """Write a random subset of positions in increasing order, in random scattered chunks: every logit equals
    a full causal forward over exactly the visible positions."""
    g = torch.Generator().manual_seed(seed)
    model, enc = _model()
    caps = _captions(2, seed)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=g)
    visible = sorted(torch.randperm(16, generator=g)[:9].tolist())
    bb = ARBackbone(model, enc)
    bb.start(caps)
    got, i = [], 0
    while i < len(visible):
        n = int(torch.randint(1, 4, (1,), generator=g))
        pos = torch.tensor(visible[i:i + n]).expand(2, -1)
        got.append(bb(pos, tokens.gather(1, pos)))
        i += n
    with torch.no_grad():
        ref = _reference(model, enc, caps, visible, tokens)
    assert torch.allclose(torch.cat(got, 1), ref.float(), atol=1e-5)
    assert bb.filled[0].nonzero().flatten().tolist() == visible


def test_a_cpu_step_reads_the_key_blocks_up_to_its_last_slot_and_gets_every_bit_of_the_whole_cache(monkeypatch):
    """An early step attends over the first key block alone (transformer.CPU_KEY_BLOCK); its logits, and those of
    every later step, are bit for bit what attending over the whole cache gives: a prefix block, an empty write,
    single tokens, a grouped forward across a block's edge, the last slot."""
    from mulosd.ar import transformer

    cfg = TransformerConfig(vocab_size=48, grid=32, dim=32, layers=2, heads=2, cond_dim=16)
    torch.manual_seed(0)
    model, enc = Transformer(cfg).eval(), SceneCaptionEncoder(cfg.cond_dim).eval()
    caps = _captions(2)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.grid ** 2))
    writes = [(torch.arange(100), None), (torch.arange(0), None), *((torch.tensor([i]), None) for i in range(100, 104)),
              (torch.arange(500, 520), torch.arange(20) // 7), (torch.tensor([1023]), None)]

    def run():
        bb = ARBackbone(model, enc, 2.0)
        out = [bb.start(caps)]
        for pos, groups in writes:
            pos = pos.expand(2, -1)
            out.append(bb(pos, tokens.gather(1, pos), groups))
        return out

    blocked = run()
    assert model._span(torch.tensor([[cfg.prefix + 103]])) == transformer.CPU_KEY_BLOCK < cfg.slots
    monkeypatch.setattr(transformer, "CPU_KEY_BLOCK", 10 ** 6)
    assert model._span(torch.tensor([[cfg.prefix + 103]])) == cfg.slots
    for a, b in zip(blocked, run(), strict=True):
        assert torch.equal(a, b)


def test_forgotten_positions_leave_the_context():
    """Write 0..3, forget 2 and 3 (a discarded draft), write 4: as if only 0, 1 and 4 had ever been written."""
    model, enc = _model()
    caps = _captions(2)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16))
    bb = ARBackbone(model, enc)
    bb.start(caps)
    bb(torch.arange(4).expand(2, 4), tokens[:, :4])
    bb.forget(torch.tensor([[2, 3]] * 2))
    assert bb.filled[0, :5].tolist() == [True, True, False, False, False]
    got = bb(torch.tensor([[4]] * 2), tokens[:, 4:5])
    with torch.no_grad():
        ref = _reference(model, enc, caps, [0, 1, 4], tokens)[:, -1:]
    assert torch.allclose(got, ref.float(), atol=1e-5)
    bb.forget(torch.tensor([[0]]), rows=torch.tensor([1]))  # one image only
    assert bb.filled[0, 0] and not bb.filled[1, 0]


@pytest.mark.parametrize("grouped", [False, True])
def test_a_ragged_forward_runs_its_real_writes_alone_and_computes_what_the_padded_one_does(grouped):
    """With each row's length given, the step projects only the real writes: the same logits (a pad's are its
    row's last real write's) and the same cache as the padded forward, through two forwards in a row."""
    torch.manual_seed(0)
    model, enc = Transformer(CFG).eval(), SceneCaptionEncoder(CFG.cond_dim).eval()
    caps = ["a red circle", "two blue squares", "a green ring above a yellow cross"]
    padded, packed = ARBackbone(model, enc, 2.0), ARBackbone(model, enc, 2.0)
    for bb in (padded, packed):
        bb.start(caps)
    packs = []
    spy = mock.patch.object(type(model.blocks[0].attn), "packed", autospec=True,
                            side_effect=lambda self, x, *a: packs.append(x.shape[0]) or real_packed(self, x, *a))
    real_packed = type(model.blocks[0].attn).packed
    for rows in ([[(0, 3, 0), (1, 5, 0), (2, 7, 1)], [(0, 1, -1)], [(0, 2, 0), (4, 9, 1)]],
                 [[(3, 4, -1)], [(1, 6, 0), (2, 8, 0), (5, 1, 1), (6, 2, 1)], [(1, 3, -1), (5, 5, 0)]]):
        pos, tok, group, lengths = padded_writes(rows)
        assert lengths.tolist() == [len(r) for r in rows]
        group = group if grouped else None
        want = padded(pos, tok, group)
        packs.clear()
        with spy:
            got = packed(pos, tok, group, lengths)
        assert packs == [2 * sum(len(r) for r in rows)] * CFG.layers  # the real writes alone, guided: twice
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        for a, b in zip(padded.cache.k + padded.cache.v, packed.cache.k + packed.cache.v, strict=True):
            assert torch.allclose(a, b, atol=1e-5)
        assert torch.equal(padded.cache.filled, packed.cache.filled)
    with pytest.raises(ValueError, match="lengths must be"):
        packed(pos, tok, None, torch.tensor([1, 0, 2]))


def test_an_image_is_the_same_alone_and_in_a_batch():
    model, enc = _model()
    caps = _captions(4)
    batch, _ = decode_ar(ARBackbone(model, enc, cfg_scale=2.0), caps, seed=7)
    for i, c in enumerate(caps):
        alone, _ = decode_ar(ARBackbone(model, enc, cfg_scale=2.0), [c], seed=7, image_ids=torch.tensor([i]))
        assert torch.equal(alone[0], batch[i])
    other, _ = decode_ar(ARBackbone(model, enc, cfg_scale=2.0), caps, seed=8)
    assert not torch.equal(other, batch), "a different seed must give different images"


def test_position_keyed_noise_gives_the_same_tokens_in_any_order():
    """Serial AR tokens are reproduced by one block forward over them (verification order), and by
    re-querying positions in a shuffled order against the filled cache."""
    model, enc = _model()
    caps = _captions(2)
    w = Warpers(temperature=1.0, top_k=20)
    tokens, trace = decode_ar(ARBackbone(model, enc), caps, seed=3, warpers=w)
    assert trace.steps == 16 and trace.forwards["verifier"] == 16
    flat = tokens.flatten(1)
    bb = ARBackbone(model, enc)
    first = bb.start(caps)
    block = bb(torch.arange(15).expand(2, 15), flat[:, :15])
    ids = torch.arange(2)
    assert torch.equal(sample(warp(first, w), 3, ids, torch.zeros(2, 1, dtype=torch.long)), flat[:, :1])
    assert torch.equal(sample(warp(block, w), 3, ids, torch.arange(1, 16).expand(2, 15)), flat[:, 1:])
    order = torch.randperm(15)
    again = bb(order.expand(2, 15), flat[:, order])
    assert torch.equal(sample(warp(again, w), 3, ids, (order + 1).expand(2, 15)), flat[:, order + 1])


def test_cfg_scale_one_is_the_conditional_model_and_guidance_combines_logits():
    model, enc = _model()
    caps = _captions(2)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16))
    with torch.no_grad():
        cond, null = model(tokens, enc(caps)), model(tokens, None)
    for scale, want in ((1.0, cond), (0.0, null), (3.0, null + 3.0 * (cond - null))):
        bb = ARBackbone(model, enc, cfg_scale=scale)
        got = torch.cat([bb.start(caps), bb(torch.arange(15).expand(2, 15), tokens[:, :15])], 1)
        assert torch.allclose(got, want.float(), atol=1e-4), scale


def test_a_linear_guidance_schedule_guides_each_token_at_its_raster_positions_scale():
    """Position p is drawn at 1 + 2 (s - 1) p / (N - 1): the conditional model alone for the first token, 2 s - 1
    for the last, s on average; written in any order and any number at a time, each token's logits are those
    of a constant scale equal to its own."""
    model, enc = _model()
    caps = _captions(2)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16))
    with torch.no_grad():
        cond, null = model(tokens, enc(caps)), model(tokens, None)
    scales = guidance_scale("linear", 4.0, torch.arange(16), 16)
    assert scales.shape == (16, 1) and scales[0].item() == 1.0 and scales[-1].item() == 7.0
    assert scales.mean().item() == pytest.approx(4.0)
    want = null + scales * (cond - null)
    bb = ARBackbone(model, enc, cfg_scale=4.0, cfg_schedule="linear")
    first = bb.start(caps)
    assert torch.allclose(first, cond[:, :1].float(), atol=1e-4)  # scale 1 at position 0
    order = torch.randperm(15)
    got = bb(order.expand(2, 15), tokens[:, order])
    assert torch.allclose(got, want[:, order + 1].float(), atol=1e-4)
    assert guidance_scale("linear", 1.0, torch.arange(16), 16) == 1.0  # no guidance at all: no null rows
    assert guidance_scale("constant", 4.0, torch.arange(16), 16) == 4.0
    with pytest.raises(ValueError, match="unknown guidance schedule"):
        ARBackbone(model, enc, cfg_scale=4.0, cfg_schedule="cosine")


def test_warpers():
    logits = torch.tensor([[[3.0, 2.0, 1.0, 0.0, -1.0]]])
    assert torch.isfinite(warp(logits, Warpers(top_k=2))).sum() == 2
    p = warp(logits, Warpers(top_p=0.8)).exp()
    full = logits.softmax(-1)
    assert (p > 0).sum() == 2 and full[0, 0, :1].sum() < 0.8 <= full[0, 0, :2].sum()
    assert torch.allclose(p.sum(-1), torch.ones(1, 1, dtype=p.dtype))
    # upstream's cut (LlamaGen, Tar): a token goes when the mass before it exceeds top_p; at exactly top_p it stays
    assert (warp(torch.zeros(1, 1, 4), Warpers(top_p=0.5)).exp() > 0).sum() == 3
    greedy = warp(logits, Warpers(temperature=0)).exp()
    assert greedy[0, 0, 0] == 1 and greedy.sum() == 1
    for bad in ({"temperature": -1}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            Warpers(**bad)


def test_gumbel_max_samples_the_warped_distribution():
    """Across 4000 positions, token frequencies match softmax probabilities (chi-square, 3 dof)."""
    logp = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(1, 4000, 4)
    got = sample(logp, 11, torch.tensor([0]), torch.arange(4000)[None])
    counts = torch.bincount(got.flatten(), minlength=4).double()
    expected = torch.tensor([400.0, 800, 1200, 1600], dtype=torch.double)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 16.3, (counts, chi2)  # p = 0.001 at 3 dof


def test_noise_is_keyed_and_in_range():
    pos = torch.arange(1000)[None]
    u = uniform(5, torch.tensor([0]), pos, stream=1)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.03
    assert torch.equal(u, uniform(5, torch.tensor([0]), pos, stream=1))
    assert not torch.equal(u, uniform(5, torch.tensor([1]), pos, stream=1))
    assert not torch.equal(u, uniform(6, torch.tensor([0]), pos, stream=1))
    assert not torch.equal(u, uniform(5, torch.tensor([0]), pos, stream=2))
    # the int64 tensor hash equals lowbias32 written with Python's unbounded ints
    def lowbias32(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    words = [0, 1, 12345, 2**31 + 7, 2**32 - 1]
    for a in words:
        for b in words:
            want = lowbias32((lowbias32((0x9E3779B9 ^ a) & 0xFFFFFFFF) ^ b) & 0xFFFFFFFF)
            # leading Python ints are folded without tensors: every mix of ints and tensors gives the same hash
            for x, y in ((a, torch.tensor(b)), (torch.tensor(a), torch.tensor(b)), (a, b)):
                assert int(hash32(x, y)) == want, (x, y)


def test_unknown_caption_words_are_refused_naming_them_and_the_vocabulary():
    enc = SceneCaptionEncoder(8)
    with pytest.raises(CaptionError) as e:
        enc(["a purple unicorn on a green background"])
    assert "'unicorn'" in str(e.value) and "circle" in str(e.value)


def test_caption_slots_distinguish_what_the_caption_says():
    enc = SceneCaptionEncoder(8)
    a, b = enc(["a red circle above a blue square", "a blue circle above a red square"])
    assert not torch.allclose(a, b)
    c, d = enc(["two rings on a striped gray background", "three rings on a striped gray background"])
    assert torch.allclose(c[[0, 2, 3]], d[[0, 2, 3]]) and not torch.allclose(c[1], d[1])


def test_backbone_refuses_bad_calls():
    model, enc = _model()
    bb = ARBackbone(model, enc)
    with pytest.raises(RuntimeError):
        bb(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))
    bb.start(_captions(1))
    with pytest.raises(ValueError):
        bb(torch.tensor([[16]]), torch.tensor([[0]]))
    with pytest.raises(ValueError):
        bb(torch.tensor([[0, 1]]), torch.tensor([[0]]))
    with pytest.raises(ValueError):
        ARBackbone(model, enc, cfg_scale=-1)


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    from mulosd.tokenizer import VQConfig, VQModel
    from mulosd.zoo import save

    torch.manual_seed(0)
    m = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32)).eval()
    return save(m, "vq_tokenizer", tmp_path_factory.mktemp("tok") / "tok", recipe="test")


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["zoo_ar_32", "zoo_ar_64", "zoo_ar_128", "zoo_ar_128_small",
                                        "zoo_ar_128 model.resolutions=[64,128] model.object_weight=4 model.ema=0.9"])
def test_zoo_ar_recipes_run_two_batches(experiment, tmp_path, tmp_path_factory, tiny_tokenizer):
    shards = tmp_path_factory.getbasetemp() / "ar_shards"  # shared: written by the first recipe only
    experiment, *levers = experiment.split()
    cmd = [sys.executable, "train.py", f"experiment={experiment}", *levers, f"hydra.run.dir={tmp_path}",
           f"model.tokenizer={tiny_tokenizer}", f"data.synth.dir={shards}", "data.synth.train_shards=1",
           "data.synth.val_shards=1", "data.synth.per_shard=8", "data.batch_size=4", "trainer.fast_dev_run=2",
           "model.transformer.dim=32", "model.transformer.layers=1", "model.transformer.heads=2",
           "model.transformer.cond_dim=16", "logger=none",
           f"data.token_cache={tmp_path_factory.getbasetemp() / 'token_cache'}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 2 batches" in r.stdout
    assert_quiet_logs(r, tmp_path / "train.log")
    assert list((tmp_path / "samples").glob("*.png")), "validation draws a sample grid"


def _export_ar(tmp, tokenizer, resolution=32):
    from mulosd.zoo import save_ar, tokenizer_digest

    cfg = TransformerConfig(vocab_size=32, grid=resolution // 8, dim=32, layers=1, heads=2, cond_dim=16)
    torch.manual_seed(0)
    model, enc = Transformer(cfg), SceneCaptionEncoder(16)
    return save_ar(model, enc, tmp, recipe="test",
                   tokenizer=str(tokenizer), tokenizer_sha256=tokenizer_digest(tokenizer), resolution=resolution,
                   sample={"cfg_scale": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0})


@pytest.mark.slow
def test_report_and_tokenizer_mismatch(tmp_path, tiny_tokenizer, capsys):
    from mulosd.reports.ar import main
    from mulosd.tokenizer import VQConfig, VQModel
    from mulosd.zoo import check_same_tokenizer, load_ar, save

    ar = _export_ar(tmp_path / "ar32", tiny_tokenizer)
    model, enc, meta = load_ar(ar)
    assert model.cfg.grid == 4 and meta["resolution"] == 32
    check_same_tokenizer(meta, tiny_tokenizer, "ar32")
    other = VQModel(VQConfig(ch=8, z_channels=16, codebook_size=32))
    save(other, "vq_tokenizer", tmp_path / "other", recipe="test")
    with pytest.raises(ValueError, match="trained on tokenizer"):
        check_same_tokenizer(meta, tmp_path / "other", "ar32")
    assert main(["--n", "6", "--batch", "3", "--models", str(ar), "--tokenizer", str(tiny_tokenizer), "--fd"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("ar: geneval32=") and 0 <= float(out[-1].split("=")[1]) <= 1
    assert "FD-VGG" in out[1] and float(out[3].split("|")[-2]) > 0  # random weights: far from the world
    assert main(["--n", "6", "--models", str(ar), "--tokenizer", str(tmp_path / "other")]) == 2
    # sampling settings other than the recorded ones, for tuning them on another prompt set
    assert main(["--n", "3", "--batch", "3", "--models", str(ar), "--tokenizer", str(tiny_tokenizer),
                 "--cfg-scale", "7", "--prompt-seed", "777"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[3].split("|")
    assert float(row[5]) == 7.0  # the CFG column
    assert main(["--n", "3", "--batch", "3", "--models", str(ar), "--tokenizer", str(tiny_tokenizer),
                 "--cfg-scale", "7", "--cfg-schedule", "linear", "--prompt-seed", "777"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[3].split("|")[5].strip() == "7.0 linear"


def test_the_report_line_names_each_size_by_the_first_model_measured_there(tiny_zoo, capsys, monkeypatch):
    import mulosd.reports.ar as report

    def evaluate(name, *args, resolution=None, **kwargs):  # a distinct score per (model, size)
        score = {"ar128": 0.25, "multi": 0.5}[Path(name).name] + (resolution or 128) / 1000
        return {"resolution": resolution or 128, "grid": 16, "params": 1, "score": {"geneval": score},
                "ms_per_token": 1.0, "images_per_s": 1.0, "cfg_scale": 2.0, "cfg_schedule": "constant"}

    monkeypatch.setattr(report, "evaluate", evaluate)
    common = ["--n", "2", "--tokenizer", str(tiny_zoo / "tok")]
    assert report.main([*common, "--models", f"{tiny_zoo / 'ar128'},{tiny_zoo / 'multi'}"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ar: geneval64=0.564 geneval128=0.378 ms_per_token128=1.00"
    assert report.main([*common, "--models", f"{tiny_zoo / 'multi'},{tiny_zoo / 'ar128'}"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ar: geneval64=0.564 geneval128=0.628 ms_per_token128=1.00"


def test_the_report_measures_each_size_of_a_multi_resolution_model_or_only_the_ones_asked(tiny_zoo, capsys):
    from mulosd.reports.ar import main

    common = ["--n", "2", "--batch", "2", "--models", str(tiny_zoo / "multi"), "--tokenizer", str(tiny_zoo / "tok")]
    assert main(common) == 0
    assert re.match(r"ar: geneval64=\d\.\d{3} geneval128=\d\.\d{3} ", capsys.readouterr().out.splitlines()[-1])
    assert main([*common, "--sizes", "128"]) == 0
    assert re.match(r"ar: geneval128=\d\.\d{3} ms_per_token128=", capsys.readouterr().out.splitlines()[-1])


@pytest.mark.slow
def test_tuning_picks_the_best_sampling_per_size_and_records_it(tmp_path, tiny_tokenizer, capsys, monkeypatch):
    from mulosd.reports.ar_tune import main
    from mulosd.zoo import load_ar

    ar = _export_ar(tmp_path / "ar32", tiny_tokenizer)
    common = ["--model", str(ar), "--tokenizer", str(tiny_tokenizer), "--n", "6", "--batch", "3"]
    assert main([*common, "--cfg", "0", "4", "--temperature", "0.5", "2", "--write"]) == 0
    out = capsys.readouterr().out
    rows = [r.split("|")[1:6] for r in out.splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) == 4, out
    scores = [float(r[4]) for r in rows]
    best = rows[scores.index(max(scores))]
    cfg, temperature = float(best[0]), float(best[2])
    _, _, meta = load_ar(ar)
    assert meta["sample_by_resolution"] == {"32": {"cfg_scale": cfg, "cfg_schedule": "constant",
                                                   "temperature": temperature, "top_k": 0}}
    assert meta["sample"]["cfg_scale"] == cfg and meta["sample_tuned_on"] == {"prompt_seed": 777, "n": 6}
    # the pick is the best score, the earlier combination on a tie; schedules are part of the grid
    fake = {(0.0, "constant", 0.5): 0.2, (0.0, "constant", 2.0): 0.6, (4.0, "constant", 0.5): 0.6,
            (4.0, "constant", 2.0): 0.1, (0.0, "linear", 0.5): 0.3, (0.0, "linear", 2.0): 0.1,
            (4.0, "linear", 0.5): 0.7, (4.0, "linear", 2.0): 0.7}
    monkeypatch.setattr("mulosd.reports.ar_tune.evaluate", lambda *a, sample, **k: {
        "score": {"geneval": fake[sample["cfg_scale"], sample["cfg_schedule"], sample["temperature"]]}})
    assert main([*common, "--cfg", "0", "4", "--temperature", "0.5", "2", "--write"]) == 0
    assert load_ar(ar)[2]["sample_by_resolution"]["32"] == {"cfg_scale": 0.0, "cfg_schedule": "constant",
                                                             "temperature": 2.0, "top_k": 0}
    assert main([*common, "--cfg", "0", "4", "--temperature", "0.5", "2", "--schedule", "constant", "linear",
                 "--write"]) == 0
    assert load_ar(ar)[2]["sample_by_resolution"]["32"] == {"cfg_scale": 4.0, "cfg_schedule": "linear",
                                                             "temperature": 0.5, "top_k": 0}
    assert load_ar(ar)[2]["sample"]["cfg_schedule"] == "linear"
    with pytest.raises(SystemExit) as e:
        main([*common, "--prompt-seed", "4242"])  # the report's own prompts
    assert e.value.code == 2 and "tune on another world seed" in capsys.readouterr().err


def test_token_batches_resume_where_they_stopped():
    from mulosd.lit.tokens import TokenBatches

    tokens = {8: torch.arange(40).view(10, 2, 2), 4: torch.arange(10).view(10, 1, 1)}
    captions = [f"c{i}" for i in range(10)]
    first = next(iter(TokenBatches(tokens, captions, 3, seed=7)))
    assert torch.equal(first["tokens"][8].flatten(1)[:, 0] // 4, first["tokens"][4].flatten()), "sizes share scenes"
    full = [b["caption"] for b, _ in zip(TokenBatches(tokens, captions, 3, seed=7), range(8), strict=False)]
    resumed = [b["caption"] for b, _ in zip(TokenBatches(tokens, captions, 3, seed=7, start=5), range(3),
                                            strict=False)]
    assert resumed == full[5:8]
    epoch0 = sum(full[:3], [])
    assert len(set(epoch0)) == 9, "an epoch draws without replacement"
    assert full[3:6] != full[:3], "each epoch has its own permutation"
    with pytest.raises(ValueError):
        TokenBatches(tokens, captions, 11, seed=0)


def _module(grids=(), **levers):
    from mulosd.lit.ar import ARModule

    torch.manual_seed(0)
    t = TransformerConfig(vocab_size=48, grid=4, dim=32, layers=1, heads=2, cond_dim=16, grids=list(grids))
    return ARModule(ARModelConfig(transformer=t, tokenizer="unused", resolution=32, cond_dropout=0.0,
                                  sample=SampleConfig(cfg_scale=1.0), optim=AROptimConfig(lr=1e-3, warmup_batches=0),
                                  train=ScheduleConfig(seed=0, batches=10), **levers))


def test_object_weight_is_a_weighted_mean_of_the_token_ces():
    torch.manual_seed(1)
    batch = {"tokens": {32: torch.randint(0, 48, (3, 4, 4))}, "caption": _captions(3),
             "objects": {32: torch.rand(3, 4, 4) < 0.3}}
    plain, weighted = _module(), _module(object_weight=5.0)
    ce = plain.ce(batch, 32)
    assert torch.allclose(plain.loss(batch), ce.mean())
    w = torch.where(batch["objects"][32].flatten(1), 5.0, 1.0)
    assert torch.allclose(weighted.loss(batch), (w * ce).sum() / w.sum())  # same init: same per-token CE
    obj = batch["objects"][32].flatten(1)
    assert (weighted.loss(batch) - ce.mean()).sign() == (ce[obj].mean() - ce[~obj].mean()).sign()
    with pytest.raises(ValueError, match="object masks"):
        weighted.loss({k: v for k, v in batch.items() if k != "objects"})


def test_ema_averages_the_weights_and_is_what_decoding_and_export_use():
    m = _module(ema=0.9)
    assert not any(p.requires_grad for p in m.ema.parameters())
    assert all(id(p) not in {id(q) for q in m.ema.parameters()} for g in m.configure_optimizers().param_groups
               for p in g["params"]), "the EMA copy is never optimised"
    w0 = m.model.head.weight.detach().clone()
    m.batches_seen = 1
    m.update_ema()  # first update: the EMA starts as a copy
    with torch.no_grad():
        m.model.head.weight.add_(1.0)
    m.batches_seen = 2
    m.update_ema()
    model, encoder = m.weights()
    assert model is m.ema.module["model"] and encoder is m.ema.module["encoder"]
    assert torch.allclose(model.head.weight, w0 + 0.1, atol=1e-6), "ema = 0.9 * old + 0.1 * new"
    # the update rides on the optimizer step (so a checkpoint written at the batch's end holds it), and only on
    # a step whose loss was finite: a skipped (non-finite) one leaves the average alone
    import lightning as L

    with torch.no_grad():
        m.model.head.weight.add_(1.0)
    with mock.patch.object(L.LightningModule, "optimizer_step", lambda *a, **k: None):
        m._stepped = False
        m.optimizer_step(0, 2, None)
        assert torch.allclose(model.head.weight, w0 + 0.1, atol=1e-6)
        m._stepped = True
        m.optimizer_step(0, 3, None)
    assert torch.allclose(model.head.weight, w0 + 0.09 + 0.2, atol=1e-5) and not m._stepped
    assert _module().weights()[0] is not None and _module().ema is None


def test_export_weights_raw_exports_the_raw_copy_and_says_so(tmp_path):
    from mulosd.zoo import load_ar

    outs = {}
    for which in ("ema", "raw"):
        torch.manual_seed(0)
        m = _module(ema=0.9, export_weights=which)
        m.batches_seen = 1
        m.update_ema()
        with torch.no_grad():
            m.model.head.weight.add_(1.0)  # the raw copy moves away from its average
        assert (m.weights()[0] is m.model) == (which == "raw")
        with mock.patch("mulosd.zoo.tokenizer_identity", return_value="t"), \
                mock.patch("mulosd.zoo.tokenizer_digest", return_value="d"):
            out = m.export(tmp_path / which, recipe="test")
        model, _, meta = load_ar(out)
        assert meta["weights"] == which
        assert meta["trained_on"].startswith(f"cpu ({torch.backends.cpu.get_cpu_capability()})")  # speed's context
        outs[which] = (model.head.weight.float(), m.model.head.weight.detach(), m.ema.module["model"].head.weight)
    for which, (exported, raw, ema) in outs.items():
        expected = raw if which == "raw" else ema
        assert torch.allclose(exported, expected, atol=1e-2), which
        assert not torch.allclose(exported, ema if which == "raw" else raw, atol=0.5), which


def test_a_multi_resolution_model_is_one_set_of_weights_seen_at_each_grid():
    cfg = TransformerConfig(vocab_size=48, grid=4, grids=(2, 4), dim=32, layers=2, heads=2, cond_dim=16)
    big, enc = _model(cfg=cfg)
    small = big.at_grid(2)
    assert small.cfg.grid == 2 and big.cfg.grid == 4 and big.at_grid(4) is big
    assert {n: p for n, p in small.named_parameters()} == {n: p for n, p in big.named_parameters()}
    # the view is exactly the model built at that grid with the same weights
    torch.manual_seed(0)
    built = Transformer(TransformerConfig(**{**cfg.__dict__, "grid": 2})).double().eval()
    built.load_state_dict(big.state_dict())
    tokens, cond = torch.randint(0, 48, (2, 4)), enc(_captions(2))
    assert torch.allclose(small(tokens, cond), built(tokens, cond))
    # KV-cached decoding on the view equals its full forward, with a cache of the view's size
    bb = ARBackbone(small, enc)
    logits = [bb.start(_captions(2))]
    for i in range(3):
        logits.append(bb(torch.full((2, 1), i), tokens[:, i:i + 1]))
    assert bb.cache.k[0].shape[2] == cfg.prefix + 4
    assert torch.allclose(torch.cat(logits, 1), small(tokens, cond).float(), atol=1e-5)
    # the resolution embedding tells the grids apart: the same prefix predicts differently
    assert not torch.allclose(small(tokens[:, :1], cond)[:, 0], big(tokens[:, :1], cond)[:, 0])
    with pytest.raises(ValueError, match="grids"):
        big.at_grid(8)
    with pytest.raises(ValueError, match="not one of"):
        TransformerConfig(grid=16, grids=(4, 8))


def test_a_multi_resolution_module_averages_the_loss_over_its_grids():
    torch.manual_seed(1)
    m = _module(grids=(2, 4), resolutions=[16, 32])
    batch = {"tokens": {32: torch.randint(0, 48, (3, 4, 4)), 16: torch.randint(0, 48, (3, 2, 2))},
             "caption": _captions(3)}
    assert m.sizes == [16, 32]
    ce16, ce32 = m.ce(batch, 16), m.ce(batch, 32)
    assert ce16.shape == (3, 4) and ce32.shape == (3, 16)
    assert torch.allclose(m.loss(batch), (ce16.mean() + ce32.mean()) / 2)


@pytest.mark.slow
def test_compiled_training_gives_the_eager_loss_and_gradients_at_every_grid():
    torch.manual_seed(1)
    batch = {"tokens": {32: torch.randint(0, 48, (3, 4, 4)), 16: torch.randint(0, 48, (3, 2, 2))},
             "caption": _captions(3)}
    drop = torch.tensor([False, True, False])
    grads = []
    for compiled in (False, True):
        m = _module(grids=(2, 4), resolutions=[16, 32], compile=compiled).train()
        with symbolic_sizes() as symbols:
            loss = m.loss(batch, drop)
        assert not symbols, f"static graphs per grid (dynamic ones fail in inductor's CUDA backward): {symbols}"
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in m.model.parameters()]))
        assert len(m._compiled) == (2 if compiled else 0), "one compiled graph per grid, and only when asked"
        m.eval()  # validation runs eagerly
        assert torch.allclose(m.ce(batch, 32), ce_eager(m, batch, 32))
    (l0, g0), (l1, g1) = grads
    assert torch.allclose(l0, l1, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g0, g1, strict=True))


@contextlib.contextmanager
def symbolic_sizes():
    """The sizes dynamo makes symbolic (automatic dynamic shapes) inside the block, as its log names them."""
    import logging

    class Collect(logging.Handler):
        def emit(self, record):
            if "create_symbol" in record.getMessage():
                found.append(record.getMessage()[:80])

    found, log, handler = [], logging.getLogger("torch.fx.experimental.symbolic_shapes"), Collect()
    torch._logging.set_logs(dynamic=logging.INFO)
    log.addHandler(handler)
    try:
        yield found
    finally:
        log.removeHandler(handler)
        torch._logging.set_logs()


def ce_eager(m, batch, size):
    from mulosd.lit.ar import teacher_forced_ce

    grid = size // m.px_per_token
    return teacher_forced_ce(m.model.at_grid(grid), batch["tokens"][size].flatten(1), m.encoder(batch["caption"]),
                             None)


def test_a_new_cycle_starts_from_an_export_of_the_same_architecture(tmp_path, tiny_tokenizer):
    from mulosd.lit.ar import ARModule
    from mulosd.zoo import load_ar

    ar = _export_ar(tmp_path / "ar32", tiny_tokenizer)

    def module(init_from, **arch):
        t = TransformerConfig(**dict(vocab_size=32, grid=4, dim=32, layers=1, heads=2, cond_dim=16) | arch)
        return ARModule(ARModelConfig(transformer=t, tokenizer=str(tiny_tokenizer), resolution=32, cond_dropout=0.0,
                                      ema=0.9, init_from=init_from))

    model, enc, _ = load_ar(ar)
    m, fresh = module(str(ar)), module(None)
    for own, theirs in ((m.model, model), (m.encoder, enc), (m.ema.module["model"], model)):
        assert all(torch.equal(p, q) for p, q in zip(own.parameters(), theirs.parameters(), strict=True))
    assert not torch.equal(fresh.model.head.weight, m.model.head.weight)
    with pytest.raises(ValueError, match="another architecture .*dim: 32 there, 64 here"):
        module(str(ar), dim=64)
    with pytest.raises(FileNotFoundError):
        module(str(tmp_path / "missing"))
    deeper = module(str(ar), layers=3)  # grown in depth: the same function (test_growing_in_depth_...)
    assert torch.equal(deeper.model.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    assert not deeper.model.blocks[2].mlp.down.weight.any()


@pytest.mark.parametrize("layers", [(2, 4), (2, 5), (3, 3)])
def test_growing_in_depth_keeps_the_function_and_trains_every_block(layers):
    """A model grown from a shallower one predicts exactly what the shallower one predicts (each new block starts
    as the identity), at every grid, and every weight of the new blocks gets a gradient
    once the zeroed projections have moved."""
    def make(n, seed):
        torch.manual_seed(seed)
        return Transformer(TransformerConfig(vocab_size=32, grid=4, grids=(2, 4), dim=32, layers=n, heads=2,
                                             cond_dim=16))

    small, big = make(layers[0], 0), make(layers[1], 1)
    big.load_grown(small)
    assert len(big.blocks) == layers[1]
    tokens, cond = torch.randint(0, 32, (3, 16)), torch.randn(3, 4, 16)
    torch.testing.assert_close(big(tokens, cond), small(tokens, cond))
    torch.testing.assert_close(big.at_grid(2)(tokens[:, :4], cond), small.at_grid(2)(tokens[:, :4], cond))
    grown = [b for b in big.blocks if not b.attn.out.weight.any()]
    assert len(grown) == layers[1] - layers[0]
    opt = torch.optim.SGD(big.parameters(), lr=0.1)
    for _ in range(2):  # the first step moves the zeroed projections, the second reaches the weights behind them
        opt.zero_grad()
        F.cross_entropy(big(tokens, cond).flatten(0, 1), tokens.flatten()).backward()
        opt.step()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for b in grown for p in b.parameters())
    with pytest.raises(ValueError, match=r"layers: 3 there, 2 here \(it can only grow\)"):
        make(2, 0).load_grown(make(3, 0))


def test_growing_in_grids_keeps_the_function_on_the_old_grids_and_starts_a_new_one_at_the_nearest():
    """The zoo v3 path: a model over the 64 / 128 px grids grown into one over 64 / 128 / 256 px predicts exactly
    what it predicted on the old grids, and the new grid's resolution embedding starts as 128 px's; a single-grid
    model grows into a multi-resolution one with zero embeddings (its function unchanged on its own grid)."""
    def make(grids, seed, grid=4):
        torch.manual_seed(seed)
        return Transformer(TransformerConfig(vocab_size=32, grid=grid, grids=grids, dim=32, layers=2, heads=2,
                                             cond_dim=16))

    old, new = make((2, 4), 0), make((2, 4, 8), 1)
    new.load_grown(old)
    tokens, cond = torch.randint(0, 32, (3, 16)), torch.randn(3, 4, 16)
    torch.testing.assert_close(new(tokens, cond), old(tokens, cond))
    torch.testing.assert_close(new.at_grid(2)(tokens[:, :4], cond), old.at_grid(2)(tokens[:, :4], cond))
    assert torch.equal(new.res_emb.weight[2], old.res_emb.weight[1])  # 8 starts as 4, its nearest
    assert new.at_grid(8)(torch.randint(0, 32, (1, 64)), cond[:1]).shape == (1, 64, 32)
    single, multi = make((), 2), make((2, 4), 3)
    multi.load_grown(single)
    assert not multi.res_emb.weight.any()
    torch.testing.assert_close(multi(tokens, cond), single(tokens, cond))
    with pytest.raises(ValueError, match=r"grids: \(2, 4, 8\) there, \(2, 4\) here \(they can only grow\)"):
        make((2, 4), 0).load_grown(make((2, 4, 8), 0))
    with pytest.raises(ValueError, match="grids: "):
        make((), 0).load_grown(make((2, 4), 0))


def test_interpolated_positions_put_a_wider_grids_tokens_where_the_narrower_grids_are():
    """rope_grid: a grid wider than rope_grid rotates token (2i, 2j) of a 2x grid as the rope_grid-wide grid rotates
    (i, j) (the same place in the image), its odd tokens half-way; grids up to rope_grid keep their own positions,
    so a model trained without it grows into one with it unchanged, and one that would move a trained grid's
    positions is refused."""
    def make(grids, grid, rope_grid, seed=0):
        torch.manual_seed(seed)
        return Transformer(TransformerConfig(vocab_size=32, grid=grid, grids=grids, dim=32, layers=2, heads=2,
                                             cond_dim=16, rope_grid=rope_grid))

    wide, narrow = make((2, 4, 8), 8, 4), make((2, 4, 8), 8, 4).at_grid(4)
    P = wide.cfg.prefix
    grid8, grid4 = wide.rope[P:].view(8, 8, -1, 2), narrow.rope[P:].view(4, 4, -1, 2)
    torch.testing.assert_close(grid8[::2, ::2], grid4)
    assert not torch.allclose(grid8[1::2, 1::2], grid4)
    unscaled = make((2, 4, 8), 8, 0)
    assert torch.equal(make((2, 4, 8), 8, 4).at_grid(4).rope, unscaled.at_grid(4).rope)  # narrow grids: their own
    assert not torch.equal(wide.rope, unscaled.rope)
    old, new = make((2, 4), 4, 0), make((2, 4, 8), 8, 4, seed=1)
    new.load_grown(old)
    tokens, cond = torch.randint(0, 32, (3, 16)), torch.randn(3, 4, 16)
    torch.testing.assert_close(new.at_grid(4)(tokens, cond), old(tokens, cond))
    with pytest.raises(ValueError, match="rope_grid: 0 there, 2 here"):
        make((2, 4, 8), 8, 2).load_grown(old)
    assert Transformer.from_config(new.to_config()).cfg.rope_grid == 4  # an export keeps it


def test_training_time_adds_up_over_a_resumed_run(monkeypatch):
    import mulosd.lit.ar as lit

    clock = iter([100.0, 130.0, 500.0, 510.0])
    monkeypatch.setattr(lit.time, "monotonic", lambda: next(clock))
    first = _module()
    first.on_train_start()  # segment 1 starts at t=100
    ckpt = {}
    first.on_save_checkpoint(ckpt)  # saved at t=130
    assert ckpt["mulosd"]["train_seconds"] == 30.0
    resumed = _module()
    resumed.on_load_checkpoint(ckpt)
    resumed.on_train_start()  # segment 2 starts at t=500
    assert resumed.trained_seconds() == 40.0  # t=510: 30 s before the kill + 10 s since


@pytest.mark.slow
def test_task_export_writes_a_checkpoints_weights_as_the_fit_does(tmp_path, tmp_path_factory, tiny_tokenizer):
    """Evaluating a long run part-way: the last checkpoint of a 2-batch run, exported with task=export, is the
    fit's own export (the EMA weights, the recipe's metadata); a missing checkpoint is one line naming the key."""
    from safetensors.torch import load_file

    from mulosd.zoo import load_ar, world_radius

    shards = tmp_path_factory.getbasetemp() / "ar_shards"
    common = ["experiment=zoo_ar_32", f"model.tokenizer={tiny_tokenizer}", f"data.synth.dir={shards}",
              "data.synth.train_shards=1", "data.synth.val_shards=1", "data.synth.per_shard=8", "data.batch_size=4",
              "model.transformer.dim=32", "model.transformer.layers=1", "model.transformer.heads=2",
              "model.transformer.cond_dim=16", "logger=none", "model.ema=0.5", "data.synth.radius=[0.1,0.12]",
              f"data.token_cache={tmp_path_factory.getbasetemp() / 'token_cache'}"]
    fit = [sys.executable, "train.py", *common, f"hydra.run.dir={tmp_path / 'run'}", "model.train.batches=2",
           "model.train.ckpt_every=2", "model.train.val_every=2", "model.optim.warmup_batches=1"]
    r = subprocess.run(fit, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    export = [sys.executable, "train.py", *common, "task=export", f"hydra.run.dir={tmp_path / 'x'}",
              f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}"]
    r = subprocess.run(export, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ours, theirs = (load_file(tmp_path / d / "export" / "model.safetensors") for d in ("x", "run"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    _, _, meta = load_ar(tmp_path / "x" / "export")
    assert meta["batches"] == 2 and "task=export" in meta["recipe"]
    for d in ("x", "run"):  # each export says which world it draws (FD-VGG and decoding=reference render in it)
        assert world_radius(load_ar(tmp_path / d / "export")[2]) == (0.1, 0.12)
    r = subprocess.run([*export[:-1], f"ckpt_path={tmp_path / 'nope.ckpt'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: ckpt_path: task=export needs")


@pytest.mark.parametrize("resolution", [32, 128])
def test_the_built_model_derives_its_sizes_before_its_config_checks_them(tiny_tokenizer, resolution):
    """train.py's AR model takes vocab_size, grid and prefix from the tokenizer, the resolution and the caption
    encoder before TransformerConfig derives from them: a learned position table holds exactly the rows this
    grid needs (not the schema default grid's), at any resolution."""
    from mulosd.training import build_module

    from .conftest import compose_config

    cfg = compose_config("train", ["model=ar", f"model.tokenizer={tiny_tokenizer}", f"model.resolution={resolution}",
                                   "++model.transformer.positions=learned", "model.transformer.dim=32",
                                   "model.transformer.heads=2", "model.transformer.layers=1"])
    t = build_module(cfg.model).model.cfg
    grid = resolution // 8
    assert (t.vocab_size, t.grid, t.pos_slots) == (32, grid, t.prefix + grid * grid - 1)
