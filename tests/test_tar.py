"""Tar: AR-DTok against an independent re-implementation of upstream's forward, its files in upstream's exact
layout (made here, nothing downloaded), refusals, and the decoding strategies on a tiny Tar pair."""

import math

import pytest
import torch
import torch.nn.functional as F

from mulosd.ar import ARBackbone
from mulosd.decoding import MuLoSDConfig, SDConfig, SJDConfig
from mulosd.decoding.ar import decode_ar
from mulosd.decoding.mulosd import decode_mulosd
from mulosd.decoding.sd import decode_sd
from mulosd.decoding.sjd import decode_sjd
from mulosd.decoding.zipar import decode_zipar
from mulosd.tar.ar_dtok import load_ardtok

TINY = {"llama-abs-tiny": (2, 2, 32)}  # a test-only size name: (layers, heads, dim)
V, COND, CLS = 64, 12, 6  # codes, feature width, the checkpoint's cls_token_num


def _hidden(dim):
    n = int(2 * 4 * dim / 3)
    return n if n % 256 == 0 else n + 256 - n % 256


def upstream_state(grid: int, seed: int = 0, layers: int = 2, dim: int = 32) -> dict:
    """A random AR-DTok state dict with upstream's key names and shapes (clip_cond, learned abs_pe)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.2  # noqa: E731
    hidden = _hidden(dim)
    sd = {"abs_pe": r(1, grid * grid + CLS - 1, dim), "clip_proj.weight": r(dim, COND), "clip_proj.bias": r(dim),
          "tok_embeddings.weight": r(V, dim), "norm.weight": 1 + r(dim), "output.weight": r(V, dim)}
    for i in range(layers):
        p = f"layers.{i}."
        sd |= {p + "attention.wqkv.weight": r(3 * dim, dim), p + "attention.wo.weight": r(dim, dim),
               p + "feed_forward.w1.weight": r(hidden, dim), p + "feed_forward.w3.weight": r(hidden, dim),
               p + "feed_forward.w2.weight": r(dim, hidden), p + "attention_norm.weight": 1 + r(dim),
               p + "ffn_norm.weight": 1 + r(dim)}
    return sd


def upstream_file(path, grid: int, seed: int = 0, sd: dict | None = None, **args):
    """What upstream's training writes: {"model": {"name", "args", "sd"}}; args as ModelArgs fields."""
    args = {"dim": 32, "n_layer": 2, "n_head": 2, "model_type": "clip_cond", "cond_dim": COND, "vocab_size": V,
            "cls_token_num": CLS, "max_seq_len": grid * grid, "multiple_of": 256} | args
    torch.save({"model": {"name": "llama-abs-tiny", "args": args, "sd": sd or upstream_state(grid, seed)}}, path)
    return path


def reference_logits(sd: dict, feats: torch.Tensor, tokens: torch.Tensor, heads: int = 2) -> torch.Tensor:
    """Upstream's ARModel forward, written independently from its description: [cond; tokens] + abs_pe at the
    absolute slot, causal attention, SwiGLU, RMSNorm (eps 1e-5); logits from the last prefix slot on."""
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    T = feats.shape[1]
    h = torch.cat([feats @ sd["clip_proj.weight"].T + sd["clip_proj.bias"], sd["tok_embeddings.weight"][tokens]], 1)
    h = h + sd["abs_pe"][:, :h.shape[1]]
    B, n, dim = h.shape
    layers = sum(k.endswith("attention.wo.weight") for k in sd)
    for i in range(layers):
        p = f"layers.{i}."
        x = rms(h, sd[p + "attention_norm.weight"])
        q, k, v = (x @ sd[p + "attention.wqkv.weight"].T).split(dim, -1)
        q, k, v = (t.view(B, n, heads, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(dim // heads)
        att = att.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf).softmax(-1)
        h = h + (att @ v).transpose(1, 2).reshape(B, n, dim) @ sd[p + "attention.wo.weight"].T
        x = rms(h, sd[p + "ffn_norm.weight"])
        ff = F.silu(x @ sd[p + "feed_forward.w1.weight"].T) * (x @ sd[p + "feed_forward.w3.weight"].T)
        h = h + ff @ sd[p + "feed_forward.w2.weight"].T
    return (rms(h, sd["norm.weight"]) @ sd["output.weight"].T)[:, T - 1:]


class Features:
    """captions -> fixed random TA-Tok-like features [B, T, COND] (the LLM and TA-Tok stand-in)."""

    def __init__(self, prefix: int):
        self.prefix = prefix

    def __call__(self, captions):
        return torch.stack([torch.randn(self.prefix, COND, generator=torch.Generator().manual_seed(len(c)))
                            for c in captions]).double()


def test_our_ardtok_matches_upstream_math_with_a_run_time_prefix_and_zero_feature_cfg(tmp_path):
    sd = upstream_state(4)
    model = load_ardtok(upstream_file(tmp_path / "ar.pth", 4, sd=sd), prefix=4, sizes=TINY).double()
    assert model.cfg.prefix == 4 and model.cfg.pos_slots == 16 + CLS - 1
    sd = {k: v.double() for k, v in sd.items()}
    captions = ["a cat", "two red dogs"]
    feats = Features(4)(captions)
    tokens = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    want_c = reference_logits(sd, feats, tokens[:, :-1])
    want_u = reference_logits(sd, torch.zeros_like(feats), tokens[:, :-1])
    assert torch.allclose(model(tokens, feats), want_c, atol=1e-5)  # teacher forcing
    # through the KV cache, with CFG against all-zero features, as the decoders call it
    scale = 4.0
    bb = ARBackbone(model, Features(4), scale)
    first = bb.start(captions)
    rest = bb(torch.arange(15).expand(2, -1), tokens[:, :-1])
    want = want_u + scale * (want_c - want_u)
    assert torch.allclose(torch.cat([first, rest], 1).double(), want, atol=1e-4)  # CFG is combined in fp32


def _pair(tmp_path, prefix=CLS):
    verifier = load_ardtok(upstream_file(tmp_path / "v.pth", 8, seed=1), prefix=prefix, sizes=TINY).double()
    drafter = load_ardtok(upstream_file(tmp_path / "d.pth", 4, seed=2), prefix=prefix, sizes=TINY).double()
    return verifier, drafter


@pytest.mark.slow
def test_every_strategy_runs_on_a_tiny_tar_pair_and_mulosd_reproduces_ar(tmp_path):
    from mulosd.samplers import LatentDownsampler, LatentUpsampler
    from mulosd.tokenizer.neighbours import neighbour_table

    verifier, drafter = _pair(tmp_path)  # the longest prefix the files allow: the last slot's row is clamped
    enc, captions = Features(CLS), ["a cat", "a dog", "three birds"]
    codebook = torch.randn(V, 8)
    up = LatentUpsampler(codebook, 2, 16, 1).double().eval()
    down = LatentDownsampler(codebook, 2, 16, 1).double().eval()
    want, _ = decode_ar(ARBackbone(verifier, enc, 4.0), captions, seed=3)
    got, trace = decode_mulosd(ARBackbone(verifier, enc, 4.0), ARBackbone(drafter, enc, 4.0), up.up, down.down,
                               captions, neighbour_table(codebook, 8),
                               MuLoSDConfig(tau=1.5, pool_k=8, resample="serial", draft_rows=1, acceptance="threshold"),
                               seed=3)
    assert torch.equal(got, want) and trace.counts["accepted"] == 0
    tokens, _ = decode_sd(ARBackbone(verifier, enc, 4.0), ARBackbone(verifier, enc, 1.0), captions,
                          SDConfig(gamma=3), seed=3)  # writes the grid's last slot
    alone, _ = decode_sd(ARBackbone(verifier, enc, 4.0), ARBackbone(verifier, enc, 1.0), captions[1:2],
                         SDConfig(gamma=3), seed=3, image_ids=torch.tensor([1]))
    assert torch.equal(alone[0], tokens[1])
    # ZipAR, LANTERN and SJD on the same pair, batch 3 with CFG
    lantern, _ = decode_sd(ARBackbone(verifier, enc, 4.0), ARBackbone(verifier, enc, 1.0), captions,
                           SDConfig(gamma=3, acceptance="lantern", pool_k=8), seed=3,
                           neighbours=neighbour_table(codebook, 8))
    zipar, _ = decode_zipar(ARBackbone(verifier, enc, 4.0), captions, window=2, seed=3)
    sjd, trace = decode_sjd(ARBackbone(verifier, enc, 4.0), captions, SJDConfig(window=4), seed=3)
    assert lantern.shape == zipar.shape == sjd.shape == (3, 8, 8) and trace.forwards["verifier"] <= 1 + 64


def test_refusals_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="prefix at most 6"):
        load_ardtok(upstream_file(tmp_path / "a.pth", 4), prefix=7, sizes=TINY)
    sd = upstream_state(4)
    sd["layers.1.feed_forward.w3.weigth"] = sd.pop("layers.1.feed_forward.w3.weight")
    with pytest.raises(ValueError, match="lacks 'layers.1.feed_forward.w3.weight'"):
        load_ardtok(upstream_file(tmp_path / "b.pth", 4, sd=sd), sizes=TINY)
    sd = upstream_state(4) | {"cls_embedding.uncond_embedding": torch.zeros(1)}
    with pytest.raises(ValueError, match="cls_embedding.uncond_embedding"):
        load_ardtok(upstream_file(tmp_path / "c.pth", 4, sd=sd), sizes=TINY)
    sd = upstream_state(4)
    sd["abs_pe"] = sd["abs_pe"][:, :-1]  # upstream would drop it silently and keep a random table
    with pytest.raises(ValueError, match="'abs_pe' has shape"):
        load_ardtok(upstream_file(tmp_path / "d.pth", 4, sd=sd), sizes=TINY)
    with pytest.raises(ValueError, match="class_cond"):
        load_ardtok(upstream_file(tmp_path / "e.pth", 4, model_type="class_cond"), sizes=TINY)
    with pytest.raises(ValueError, match="unknown AR-DTok size"):
        load_ardtok(upstream_file(tmp_path / "f.pth", 4))
    torch.save({"state": upstream_state(4)}, tmp_path / "g.pth")
    with pytest.raises(ValueError, match="not an AR-DTok checkpoint"):
        load_ardtok(tmp_path / "g.pth", sizes=TINY)


class Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickled_payload_is_refused_not_run(tmp_path, capsys):
    torch.save({"model": {"name": "llama-abs-tiny", "args": {}, "sd": {}, "extra": Payload()}}, tmp_path / "p.pth")
    with pytest.raises(ValueError, match="weights-only"):
        load_ardtok(tmp_path / "p.pth", sizes=TINY)
    assert "must never run" not in capsys.readouterr().out


# --- the whole backbone=tar pipeline on tiny random models in upstream's layouts ---------------------------------

TA_CODES, TA_DIM, HIDDEN = 16, 8, 48  # TA-Tok codebook, bottleneck width, feature width (12 SigLIP2 heads of 4)


def ta_tok_file(path, seed=0):
    """What upstream's TextAlignedTokenizer saves: {"model": {"args", "sd"}}; the sd holds the image encoder too
    (here one stand-in key per encode-only part), which the decode path skips."""
    from mulosd.tar.ta_tok import TATokDecoder

    torch.manual_seed(seed)
    dec = TATokDecoder(TA_CODES, TA_DIM, HIDDEN, depth=1, l2_normalized=True, intermediate_size=32, num_patches=16)
    names = {"embedding.": "bottleneck.regularizer.embedding.",
             "embedding_proj.": "bottleneck.regularizer.embedding_proj.", "out_linear.": "bottleneck.out_linear."}
    sd = {}
    for k, v in dec.state_dict().items():
        prefix = next((p for p in names if k.startswith(p)), None)
        sd[names[prefix] + k.removeprefix(prefix) if prefix else k] = v
    sd |= {"encoder.embeddings.patch_embedding.weight": torch.zeros(1), "encode_task_layer.0.weight": torch.zeros(1),
           "bottleneck.in_linear.weight": torch.zeros(1)}
    args = {"bottleneck": {"name": "bottleneck", "args": {"bottleneck_dim": TA_DIM, "regularizer": {
        "name": "simvq", "args": {"codebook_size": TA_CODES, "l2_normalized": True}}}}, "decoder_depth": 1,
        "teacher": "google/siglip2-so400m-patch14-384", "input_type": "rec"}
    torch.save({"model": {"args": args, "sd": sd}}, path)
    return dec


def tiny_llm(path):
    """A random Qwen2 with a word-level tokenizer holding Tar's added tokens and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    words = ["[UNK]", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "You", "are", "a", "helpful",
             "assistant.", "cat", "dog", "red"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>")
    fast.add_tokens(["<im_start>", "<im_end>", "<S0>", "<S1>", "<S2>"] + [f"<I{i}>" for i in range(TA_CODES)])
    fast.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tar_dir(tmp_path_factory):
    """Upstream's four files for a tiny Tar: AR-DTok 256 px (4 x 4) and 512 px (8 x 8) over 81 TA-Tok features
    (scale 2), TA-Tok, and a VQ-16 with upstream's fixed ch=128 and num_res_blocks=2 (a shrunk ch_mult)."""
    from mulosd.llamagen.vq16 import LlamaGenVQ, VQ16Config

    d = tmp_path_factory.mktemp("tar")
    for size, grid, seed in ((256, 4, 1), (512, 8, 2)):
        sd = upstream_state(grid, seed)
        sd["abs_pe"] = torch.randn(1, grid * grid + 81 - 1, 32) * 0.2
        sd["clip_proj.weight"] = torch.randn(32, HIDDEN) * 0.2
        upstream_file(d / f"ar_dtok_lp_{size}px.pth", grid, sd=sd, cls_token_num=81, cond_dim=HIDDEN)
    ta_tok_file(d / "ta_tok.pth")
    torch.manual_seed(3)
    vq = LlamaGenVQ(VQ16Config(ch=128, ch_mult=[1, 1, 1, 1, 1], num_res_blocks=2, z_channels=8, codebook_size=V))
    state = vq.state_dict() | {"quantize.codebook_used": torch.zeros(V)}
    torch.save({"model": state}, d / "vq_ds16_t2i.pt")
    tiny_llm(d / "llm")
    return d


def _tar_samplers(d):
    from mulosd.llamagen.models import load_vq
    from mulosd.samplers import LatentDownsampler, LatentUpsampler
    from mulosd.zoo import save

    codebook = load_vq(d / "vq_ds16_t2i.pt").codebook()
    save(LatentUpsampler(codebook, 2, 16, 1, head="latent"), "sampler", d / "up", recipe="test", stage="gan")
    save(LatentDownsampler(codebook, 2, 16, 1), "sampler", d / "down", recipe="test", stage="token_ce")


@pytest.mark.slow
def test_the_whole_tar_pipeline_from_a_prompt_to_an_image(tar_dir, monkeypatch, tmp_path, caplog):
    from mulosd import tar
    from mulosd.config import ConfigError
    from mulosd.pipeline import Pipeline

    from .conftest import compose_config

    monkeypatch.setitem(tar.ar_dtok.SIZES, "llama-abs-tiny", TINY["llama-abs-tiny"])
    _tar_samplers(tar_dir)
    common = ["backbone=tar", f"tar.ckpt_dir={tar_dir}", f"tar.llm={tar_dir / 'llm'}", "tar.scale=2",
              "tar.download=false", "tar.dtype=float32", f"models.up={tar_dir / 'up'}",
              f"models.down={tar_dir / 'down'}", "tau=0.05", "pool_k=8", "prompt=a red cat"]
    cfg = compose_config("infer", common)
    pipe = Pipeline.from_config(cfg, {"mulosd", "ar"})
    captions, ids = ["a red cat", "a dog"], torch.arange(2)
    tokens, trace = pipe.decode("mulosd", cfg, captions, ids)
    ar_tokens, ar_trace = pipe.decode("ar", cfg, captions, ids)
    assert tokens.shape == ar_tokens.shape == (2, 8, 8)
    assert trace.stages["llm"] > 0 and trace.stages["ta_tok"] > 0 and trace.forwards["verifier"] < 64
    images = pipe.images(tokens)
    assert len(images) == 2 and images[0].shape == (128, 128, 3)
    # the LLM stage is seeded per image: a prompt's features do not depend on its batch
    pipe.conditioner.prepare(captions[1:], cfg.seed, ids[1:])
    alone = pipe.conditioner.features[0]
    pipe.conditioner.prepare(captions, cfg.seed, ids)
    assert torch.equal(alone, pipe.conditioner.features[1])
    # infer.py end to end: images, the acceptance maps, and each stage's time on its own line
    from mulosd.inference import run

    with caplog.at_level("INFO", logger="mulosd.inference"):
        result = run(compose_config("infer", common + ["prompts=[a red cat,a dog]", "batch_size=2"]), tmp_path / "run")
    assert len(result["images"]) == 2 and (tmp_path / "run" / "acceptance_000.png").is_file()
    assert "tar stages: llm " in caplog.text and "vq_decode" in caplog.text
    # saved TA-Tok ids skip the LLM (the LLM path is not even looked at)
    torch.save(torch.randint(0, TA_CODES, (81,)), tmp_path / "ids.pt")
    cfg = compose_config("infer", [c for c in common if not c.startswith("tar.llm")]
                         + ["tar.llm=/nonexistent", f"tar.features={tmp_path / 'ids.pt'}"])
    pipe = Pipeline.from_config(cfg, {"ar"})
    tokens, trace = pipe.decode("ar", cfg, captions, ids)
    assert tokens.shape == (2, 8, 8) and trace.stages["llm"] == 0
    assert torch.equal(pipe.conditioner.features[0], pipe.conditioner.features[1])  # one set of ids for both
    torch.save(torch.full((80,), 3), tmp_path / "short.pt")  # scale 2 needs 81 ids per prompt
    with pytest.raises(ConfigError, match="tar.features: .* needs 81 per prompt"):
        Pipeline.from_config(compose_config("infer", [c for c in common if not c.startswith("tar.llm")]
                                            + [f"tar.features={tmp_path / 'short.pt'}"]), {"ar"})


def test_ta_tok_refusals_name_the_key(tmp_path):
    from mulosd.tar.ta_tok import load_ta_tok

    ta_tok_file(tmp_path / "ta.pth")
    obj = torch.load(tmp_path / "ta.pth", weights_only=True)
    assert load_ta_tok(tmp_path / "ta.pth")(torch.randint(0, TA_CODES, (2, 9))).shape == (2, 9, HIDDEN)
    sd = obj["model"]["sd"]
    del sd["decoder.vision_model.post_layernorm.weight"]
    torch.save(obj, tmp_path / "missing.pth")
    with pytest.raises(ValueError, match="lacks 'decoder.vision_model.post_layernorm.weight'"):
        load_ta_tok(tmp_path / "missing.pth")
    sd["bottleneck.regularizer.codebook_used"] = torch.zeros(1)
    sd["decoder.vision_model.post_layernorm.weight"] = torch.ones(HIDDEN)
    torch.save(obj, tmp_path / "extra.pth")
    with pytest.raises(ValueError, match="codebook_used"):  # neither decode path nor a known encode-only part
        load_ta_tok(tmp_path / "extra.pth")


def test_offline_without_the_files_is_one_line_naming_every_missing_file(tmp_path, monkeypatch, capsys):
    from .conftest import cli_error

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli_error("infer.py", ["backbone=tar", f"tar.ckpt_dir={tmp_path}", "tar.llm=csuhan/Tar-1.5B",
                                  "prompt=a cat"], tmp_path / "run", capsys) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    for name in ("ar_dtok_lp_256px.pth", "ar_dtok_lp_512px.pth", "ta_tok.pth", "vq_ds16_t2i.pt", "Tar-1.5B"):
        assert name in err, name
    assert cli_error("infer.py", ["backbone=tar", "r=4", "prompt=a cat"], tmp_path / "r", capsys) == 2
    assert "r: tar at 512 px over the 256 px drafter is r=2" in capsys.readouterr().err


def test_the_gpu_cost_model_covers_tar_shapes_on_tiny_ones():
    """scripts/gpu_check.sh measures AR-DTok-LP shapes at 512 and 1024 px; here the same harness, tiny."""
    from mulosd.reports.costmodel import SIZES, _kv_bytes, _model, measure, table

    m = measure("tar_tiny", "cpu", torch.float32, rates=(1.0,), cfg_scale=4.0)
    rounds = -(-2 // MuLoSDConfig().rows_per_round(2))  # infer.py's knobs over a 2-row drafter
    assert m["r"] == 4 and m["mulosd"]["1.0"]["verifier_forwards"] == 1 + rounds  # the prefix, one per round
    assert "| 100% |" in table(m) and m["memory_gb"]["verifier"]["kv_cache_per_image"] > 0
    # the real shapes, weight-free: 2 (K, V) x 30 layers x (729 + 64^2) slots x 1280 x 2 bytes x 2 (CFG)
    with torch.device("meta"):
        lp = _model(SIZES["tar1024"], 64)
    assert _kv_bytes(lp, torch.bfloat16) == 2 * 30 * (729 + 4096) * 1280 * 2 * 2
    assert "s_ar" not in measure("tar_tiny", "cpu", torch.float32, rates=())
