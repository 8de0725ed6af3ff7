"""LlamaGen compatibility on small random models in the upstream layout: the converted GPT reproduces an
independent re-implementation of upstream's forward (zeroed caption RoPE, SwiGLU width, left-padded T5 mask),
misshapen or foreign checkpoints are refused by key name, and the converted model decodes through the
project's backbone."""

import math

import pytest
import torch
import torch.nn.functional as F

from mulosd.ar import ARBackbone, Transformer
from mulosd.decoding.ar import decode_ar
from mulosd.llamagen.gpt import from_upstream, gpt_config, to_upstream

# upstream's caption embedder is always 120 slots (the caption length is never passed to it): a fixture upstream
# could have written keeps them and shrinks widths, layers, grid and vocab
SIZE, GRID, VOCAB, SLOTS, CAP = (2, 2, 64), 4, 96, 120, 24


def _upstream_state(seed=0):
    """A random GPT state dict with upstream's key names and shapes, made without this project's modules."""
    g = torch.Generator().manual_seed(seed)
    layers, heads, dim = SIZE
    hidden = 256 * math.ceil(int(8 * dim / 3) / 256)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) * 0.2  # noqa: E731
    sd = {"tok_embeddings.weight": r(VOCAB, dim), "norm.weight": 1 + r(dim), "output.weight": r(VOCAB, dim),
          "cls_embedding.cap_proj.fc1.weight": r(dim, CAP), "cls_embedding.cap_proj.fc2.weight": r(dim, dim),
          "cls_embedding.uncond_embedding": r(SLOTS, CAP)}  # no freqs_cis: upstream rebuilds it, never saves it
    for i in range(layers):
        p = f"layers.{i}."
        sd |= {p + "attention.wqkv.weight": r(3 * dim, dim), p + "attention.wo.weight": r(dim, dim),
               p + "attention_norm.weight": 1 + r(dim), p + "ffn_norm.weight": 1 + r(dim),
               p + "feed_forward.w1.weight": r(hidden, dim), p + "feed_forward.w3.weight": r(hidden, dim),
               p + "feed_forward.w2.weight": r(dim, hidden)}
    return sd


def _reference(sd, cond, tokens, visible):
    """Upstream's math, written from its source: logits [B, 1 + n, V] at the last caption slot and at tokens."""
    layers, heads, dim = SIZE
    hd = dim // heads
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w  # noqa: E731
    caption = F.gelu(F.linear(cond, sd["cls_embedding.cap_proj.fc1.weight"]), approximate="tanh")
    x = torch.cat([F.linear(caption, sd["cls_embedding.cap_proj.fc2.weight"]),
                   F.embedding(tokens, sd["tok_embeddings.weight"])], 1)
    half = hd // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].double() / half))
    f = torch.outer(torch.arange(GRID).double(), freqs)
    grid = torch.cat([f[:, None].expand(-1, GRID, -1), f[None].expand(GRID, -1, -1)], -1).flatten(0, 1)
    cache = torch.cat([torch.zeros(SLOTS, hd // 2, 2, dtype=torch.float64),
                       torch.stack([grid.cos(), grid.sin()], -1)])[: x.shape[1]]

    def rope(t):  # [B, S, H, hd]
        ts = t.reshape(*t.shape[:-1], -1, 2)
        c = cache.view(1, t.shape[1], 1, -1, 2)
        return torch.stack([ts[..., 0] * c[..., 0] - ts[..., 1] * c[..., 1],
                            ts[..., 1] * c[..., 0] + ts[..., 0] * c[..., 1]], -1).flatten(3)

    S = x.shape[1]
    mask = torch.tril(torch.ones(S, S, dtype=torch.bool))[None].repeat(x.shape[0], 1, 1)
    mask[:, :, :SLOTS] &= visible[:, None, :]  # generate(): causal_mask * emb_masks, then the diagonal back
    mask |= torch.eye(S, dtype=torch.bool)
    for i in range(layers):
        p = f"layers.{i}."
        h = rms(x, sd[p + "attention_norm.weight"])
        q, k, v = F.linear(h, sd[p + "attention.wqkv.weight"]).split(dim, -1)
        q, k, v = (t.view(x.shape[0], S, heads, hd) for t in (q, k, v))
        q, k = rope(q), rope(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask[:, None])
        x = x + F.linear(y.transpose(1, 2).reshape(x.shape[0], S, dim), sd[p + "attention.wo.weight"])
        h = rms(x, sd[p + "ffn_norm.weight"])
        gate, up = F.linear(h, sd[p + "feed_forward.w1.weight"]), F.linear(h, sd[p + "feed_forward.w3.weight"])
        x = x + F.linear(F.silu(gate) * up, sd[p + "feed_forward.w2.weight"])
    return F.linear(rms(x, sd["norm.weight"]), sd["output.weight"])[:, SLOTS - 1:]


def _converted(sd):
    cfg = gpt_config(SIZE, GRID, vocab_size=VOCAB, prefix=SLOTS, caption_dim=CAP)
    model = Transformer(cfg).double().eval()
    model.load_state_dict(from_upstream(sd, cfg))
    return model, cfg


class _FixedEncoder:
    """Stands in for T5: fixed features and a left-padding mask per caption."""

    def __init__(self, feats, visible):
        self.feats, self.visible, self.dim, self.prefix = feats, visible, CAP, SLOTS

    def __call__(self, captions):
        return self.feats[: len(captions)], self.visible[: len(captions)]


def test_converted_gpt_matches_upstream_math_with_padded_captions_through_the_kv_cache():
    sd = _upstream_state()
    model, _ = _converted(sd)
    g = torch.Generator().manual_seed(1)
    cond = torch.randn(2, SLOTS, CAP, generator=g, dtype=torch.float64)
    visible = torch.ones(2, SLOTS, dtype=torch.bool)
    visible[0, :SLOTS - 4] = False  # a 4-token caption, left padded as upstream pads it
    tokens = torch.randint(0, VOCAB, (2, 7), generator=g)
    want = _reference(sd, cond, tokens, visible)
    bb = ARBackbone(model, _FixedEncoder(cond, visible), cfg_scale=1.0)
    got = torch.cat([bb.start(["a", "b"]), bb(torch.arange(7).expand(2, -1), tokens)], dim=1)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    # the padding matters: ignoring it changes the logits
    assert not torch.allclose(_reference(sd, cond, tokens, torch.ones_like(visible)), want, atol=1e-3)


def test_converted_gpt_decodes_and_round_trips_to_the_upstream_layout():
    sd = _upstream_state()
    model, cfg = _converted(sd)
    back = to_upstream(model.state_dict(), cfg)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in back)
    cond = torch.randn(2, SLOTS, CAP, dtype=torch.float64)
    bb = ARBackbone(model, _FixedEncoder(cond, torch.ones(2, SLOTS, dtype=torch.bool)), cfg_scale=4.0)
    tokens, trace = decode_ar(bb, ["a", "b"], seed=0)
    assert tokens.shape == (2, GRID, GRID) and trace.steps == GRID * GRID


@pytest.mark.parametrize("edit,named", [
    (lambda sd: sd.pop("layers.1.ffn_norm.weight"), "layers.1.ffn_norm.weight"),
    (lambda sd: sd.__setitem__("layers.0.attention.wo.weight", torch.zeros(64, 32)), "layers.0.attention.wo.weight"),
    (lambda sd: sd.__setitem__("tok_embeddings.weight", torch.zeros(50, 64)), "tok_embeddings.weight"),
    (lambda sd: sd.__setitem__("layers.2.attention.wo.weight", torch.zeros(64, 64)), "layers.2.attention.wo.weight"),
])
def test_a_checkpoint_that_disagrees_is_refused_naming_the_key(edit, named):
    sd = _upstream_state()
    edit(sd)
    cfg = gpt_config(SIZE, GRID, vocab_size=VOCAB, prefix=SLOTS, caption_dim=CAP)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        from_upstream(sd, cfg)


# --- upstream-style checkpoint files through the real loader -------------------------------------------------

# upstream's VQ-16 code fixes ch=128 and num_res_blocks=2; only ch_mult, z_channels and the codebook vary
TINY_VQ = dict(ch=128, ch_mult=[1, 1, 1, 1, 1], num_res_blocks=2, z_channels=8, codebook_size=VOCAB)


def _gpt_file(path, grid, seed):
    """An upstream-style training checkpoint: {"model": state, "args": Namespace} with a GPT for `grid`."""
    import argparse

    global GRID
    saved, GRID = GRID, grid
    try:
        state = {k: v.float() for k, v in _upstream_state(seed).items()}
    finally:
        GRID = saved
    torch.save({"model": state, "args": argparse.Namespace(gpt_model="GPT-tiny", image_size=grid * 16)}, path)


def _vq_file(path, seed=0, **override):
    from mulosd.llamagen.vq16 import LlamaGenVQ, VQ16Config

    torch.manual_seed(seed)
    state = LlamaGenVQ(VQ16Config(**(TINY_VQ | override))).state_dict()
    state["quantize.codebook_used"] = torch.zeros(65536)  # upstream's usage buffer, ignored on load
    torch.save({"model": state}, path)


@pytest.fixture(scope="module")
def llamagen_dir(tmp_path_factory):
    from mulosd.llamagen.checkpoints import STAGE1_FILE, STAGE2_FILE, VQ_FILE

    d = tmp_path_factory.mktemp("llamagen")
    _vq_file(d / VQ_FILE)
    _gpt_file(d / STAGE1_FILE, 16, seed=1)
    _gpt_file(d / STAGE2_FILE, 32, seed=2)
    return d


def _load(d, **kw):
    from mulosd.llamagen import load_llamagen
    from mulosd.llamagen.vq16 import VQ16Config

    enc = _FixedEncoder(torch.randn(2, SLOTS, CAP), torch.ones(2, SLOTS, dtype=torch.bool))
    return load_llamagen(d, encoder=enc, download=False, gpt=SIZE,
                         gpt_config=dict(vocab_size=VOCAB, prefix=SLOTS, caption_dim=CAP), vq=VQ16Config(**TINY_VQ),
                         **kw)


@pytest.mark.slow
def test_upstream_files_load_cache_as_safetensors_and_decode_with_every_strategy(llamagen_dir):
    from mulosd.decoding import MuLoSDConfig, SDConfig
    from mulosd.decoding.mulosd import decode_mulosd
    from mulosd.decoding.sd import decode_sd
    from mulosd.decoding.zipar import decode_zipar
    from mulosd.llamagen.checkpoints import STAGE2_FILE
    from mulosd.llamagen.models import load_gpt
    from mulosd.samplers import LatentDownsampler, LatentUpsampler
    from mulosd.tokenizer.neighbours import neighbour_table

    t2i = _load(llamagen_dir)
    assert len(list(llamagen_dir.glob(".*.safetensors"))) == 3  # converted once, next to the files
    again = _load(llamagen_dir)  # from the cache
    assert all(torch.equal(a, b) for a, b in zip(t2i.verifier.state_dict().values(),
                                                  again.verifier.state_dict().values(), strict=True))
    assert (t2i.verifier.cfg.grid, t2i.drafter.cfg.grid, t2i.tokenizer.downsample) == (32, 16, 16)
    caps = ["a cat", "a dog"]
    bb = lambda m: ARBackbone(m, t2i.encoder, cfg_scale=t2i.sample["cfg_scale"])  # noqa: E731
    codebook = t2i.tokenizer.codebook()
    nb = neighbour_table(codebook, 4)
    up, down = LatentUpsampler(codebook, 2, 16, 1).eval(), LatentDownsampler(codebook, 2, 16, 1).eval()
    # no small LlamaGen drafter is released: sd runs with a copy of the verifier read through the same loader
    small = load_gpt(llamagen_dir / STAGE2_FILE, 512, SIZE, vocab_size=VOCAB, prefix=SLOTS, caption_dim=CAP)
    runs = {"ar": decode_ar(bb(t2i.verifier), caps, seed=0),
            "zipar": decode_zipar(bb(t2i.verifier), caps, window=8, seed=0),
            "sd": decode_sd(bb(t2i.verifier), bb(small), caps, SDConfig(gamma=3), neighbours=nb, seed=0),
            "mulosd": decode_mulosd(bb(t2i.verifier), bb(t2i.drafter), up.up, down.down, caps, nb,
                                    MuLoSDConfig(tau=0.01, pool_k=4), seed=0)}
    for name, (tokens, trace) in runs.items():
        assert tokens.shape == (2, 32, 32), name
        # drafts that the verifier accepts save verifier forwards (sd still drafts serially)
        assert (trace.forwards["verifier"] < 32 * 32) == (name != "ar"), name
    images = t2i.tokenizer.decode(runs["mulosd"][0][:, :8, :8])  # a 128 px corner: full-width convolutions are slow
    assert images.shape == (2, 3, 128, 128) and torch.isfinite(images).all()


def test_a_vq_checkpoint_that_disagrees_is_refused_naming_the_key(tmp_path, llamagen_dir):
    import shutil

    from mulosd.llamagen.checkpoints import STAGE2_FILE, VQ_FILE

    shutil.copy(llamagen_dir / STAGE2_FILE, tmp_path / STAGE2_FILE)
    _vq_file(tmp_path / VQ_FILE, codebook_size=VOCAB * 2)
    with pytest.raises(ValueError, match=r"quantize\.embedding\.weight"):
        _load(tmp_path, drafter=False)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))  # would create the marker file if ever unpickled


def test_a_pickled_payload_in_a_pt_file_is_never_executed(tmp_path):
    from mulosd.llamagen.checkpoints import read_pt

    marker = tmp_path / "pwned"
    torch.save({"model": {"w": torch.zeros(1)}, "extra": _Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match="not a weights-only checkpoint"):
        read_pt(tmp_path / "evil.pt")
    assert not marker.exists()


def test_missing_files_are_named_in_one_line(tmp_path):
    from mulosd.llamagen.checkpoints import MissingCheckpoints, locate

    with pytest.raises(MissingCheckpoints, match=r"vq_ds16_t2i\.pt, t2i_XL_stage2_512\.pt.*huggingface\.co"):
        locate(["vq_ds16_t2i.pt", "t2i_XL_stage2_512.pt"], tmp_path, download=False)


@pytest.mark.slow
def test_the_real_sampler_recipe_trains_on_a_llamagen_vq16_file(llamagen_dir, tmp_path, tmp_path_factory):
    """`python train.py experiment=upsampler_gan tokenizer=llamagen_vq16 r=2` (two batches, tiny VQ-16, SynthScenes
    shards standing in for LAION-COCO-Aesthetic)."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    shards = tmp_path_factory.getbasetemp() / "llamagen_shards"
    args = ["experiment=upsampler_gan", "tokenizer=llamagen_vq16", "r=2", "model.init_from=null",
            f"data.synth.dir={shards}", "data.synth.train_shards=1", "data.synth.val_shards=1",
            "data.synth.per_shard=8", "data.synth.size=64", "data.image_size=64", "data.batch_size=4",
            "model.width=16", "model.depth=1", "model.loss.image.disc_start=1", "logger=none",
            "trainer.fast_dev_run=2", f"hydra.run.dir={tmp_path}"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "MULOSD_LLAMAGEN_DIR": str(llamagen_dir), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 2 batches (8 samples" in r.stdout


def test_the_gpu_cost_model_harness_runs_on_tiny_shapes(tmp_path):
    """scripts/gpu_check.sh measures LlamaGen-XL shapes on a GPU; here the same harness on tiny ones."""
    from mulosd.decoding import MuLoSDConfig
    from mulosd.reports.costmodel import measure, table

    m = measure("tiny", "cpu", torch.bfloat16, rates=(1.0, 0.5))  # bf16, as on the GPU
    full, half = m["mulosd"]["1.0"], m["mulosd"]["0.5"]
    assert m["tokens"] == 64  # an 8 x 8 verifier grid over a 4 x 4 drafter
    rounds = -(-4 // MuLoSDConfig().rows_per_round(4))  # it measures what infer.py ships
    assert full["resampled"] == 0 and full["verifier_forwards"] == 1 + rounds  # the prefix, then one per round
    assert half["resampled"] > 0 and half["verifier_forwards"] > full["verifier_forwards"]
    assert m["ms_ar_step"] > 0 and "| 50% |" in table(m)


@pytest.mark.parametrize("raw,clean", [
    ("A Photo of a CAT at https://example.com/x.jpg", "a photo of a cat at ."),
    ("this-is-my-cute-cat", "this is my cute cat"),  # more than three joiners: they become spaces
    ("“quoted” text", '"quoted" text'),
    ("<b>Bold</b> dog", "bold dog"),
    ("@user hello there", "hello there"),
    ("Free shipping! red shoes 10x20 jc6640", "! red shoes"),
    ("a cat.next to a dog", "a cat. next to a dog"),
    ("photo #12 of 1234567 items  ...  nice", "photo of items nice"),
    ("'hello'", "hello"),
    ("A — B – C", "a - b - c"),
    ("a red circle above a blue square", "a red circle above a blue square"),
])
def test_captions_are_cleaned_twice_as_upstream_cleans_them(raw, clean):
    """Expected outputs worked out by hand from upstream's rules (and checked once against its own function on
    5223 captions, docs/results.md)."""
    from mulosd.llamagen.captions import clean_caption, preprocess

    assert preprocess(raw) == clean
    assert preprocess(raw) == clean_caption(clean_caption(raw))


def test_flan_t5_runs_in_the_runs_precision_on_cleaned_captions(tmp_path):
    """A tiny random T5 in the hub's layout (built here): the encoder cleans captions before tokenising and
    keeps the precision it is given (bf16, as upstream samples)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    from mulosd.llamagen.t5 import FlanT5Encoder

    words = ["<pad>", "</s>", "<unk>", "a", "bold", "dog", "cat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(tmp_path)
    torch.manual_seed(0)
    T5EncoderModel(T5Config(vocab_size=len(words), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)
                   ).save_pretrained(tmp_path)
    enc = FlanT5Encoder(str(tmp_path), dtype=torch.bfloat16)
    assert next(enc.model.parameters()).dtype == torch.bfloat16
    feats, visible = enc(["<b>A BOLD</b>   dog", "a bold dog"])
    assert feats.shape == (2, 120, 16) and visible[0].sum() == 3
    assert torch.equal(feats[0], feats[1])  # the same caption once cleaned


def test_greedy_sampling_with_a_released_backbone_warns(llamagen_dir, monkeypatch, caplog):
    from mulosd import pipeline
    from mulosd.pipeline import Pipeline

    from .conftest import compose_config

    t2i = _load(llamagen_dir, drafter=False)
    monkeypatch.setattr("mulosd.llamagen.load_llamagen", lambda *a, **k: t2i)
    cfg = compose_config("infer", ["backbone=llamagen_t2i", f"llamagen.ckpt_dir={llamagen_dir}", "decoding=ar",
                                   "temperature=0", "llamagen.download=false", "cfg_scale=0.5"])
    with caplog.at_level("WARNING", logger=pipeline.__name__):
        pipe = Pipeline.from_config(cfg, {"ar"})
    assert "greedy" in caplog.text
    assert pipe.verifier.cfg_scale == 1.0  # guidance only above 1, as upstream applies it
