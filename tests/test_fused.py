"""The C decode step (mulosd.ar.fused) against the transformer's own step: the same logits, cache and mask for a
few tokens per row, with and without guidance, float32 and float16-exact weights; a row's logits do not depend
on its batch; the draw after a step gives sampling.draw's tokens; compile=true decodes give the tokens of the
step they replace; models it does not cover fall back."""

import pytest
import torch

from mulosd.ar import ARBackbone, Transformer, TransformerConfig, Warpers
from mulosd.ar.backbone import guide
from mulosd.ar.fused import FusedStep, library
from mulosd.ar.sampling import draw
from mulosd.ar.transformer import KVCache
from mulosd.data.synthscenes.encoder import SceneCaptionEncoder
from mulosd.decoding.ar import decode_ar
from mulosd.decoding.zipar import decode_zipar

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler to build the fused step")

CFG = TransformerConfig(vocab_size=64, grid=4, dim=32, layers=2, heads=2, cond_dim=16)
CAPS = ["a red circle", "two blue squares on a gray background", "a green ring above a yellow cross"]


def _model(half: bool):
    torch.manual_seed(0)
    model, enc = Transformer(CFG).eval(), SceneCaptionEncoder(CFG.cond_dim).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
            if half:  # what an export holds: float16 values
                p.copy_(p.half().float())
    return model.requires_grad_(False), enc.requires_grad_(False)


def _context(model, enc, rows: int):
    """A cache with the prefix and a few tokens written, some of them forgotten again."""
    bb = ARBackbone(model, enc, cfg_scale=1.0)
    bb.start((CAPS * 2)[:rows])
    pos = torch.arange(6).expand(rows, -1)
    bb(pos, torch.randint(0, CFG.vocab_size, (rows, 6), generator=torch.Generator().manual_seed(1)))
    bb.forget(torch.tensor([[1, 4]]).expand(rows, -1))
    return bb.cache


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("scale", [1.0, 2.5])
@pytest.mark.parametrize("n", [1, 3])
def test_the_fused_step_is_the_models_step(half, scale, n):
    model, enc = _model(half)
    fused = FusedStep.for_model(model, scale)
    assert fused is not None and fused.struct.half == int(half)
    rows = 4  # two images, doubled by guidance (or four unguided rows)
    cache, ours = _context(model, enc, rows), _context(model, enc, rows)
    slots = torch.tensor([[10, 12, 11], [13, 10, 18], [7, 8, 9], [19, 6, 14]])[:, :n]
    tokens = torch.randint(0, CFG.vocab_size, (rows, n), generator=torch.Generator().manual_seed(2))
    want = guide(model.step(slots, model.embed(tokens), cache), scale)
    got = fused(slots, tokens, ours)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert torch.equal(ours.filled, cache.filled)
    for a, b in zip(ours.k + ours.v, cache.k + cache.v, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_fused_step_guides_each_token_at_its_own_scale():
    """A guidance schedule's per-token scales ([images, n, 1]) in the C step: the graph's guide, token by token."""
    model, enc = _model(False)
    fused = FusedStep.for_model(model, 4.0)
    cache, ours = _context(model, enc, 4), _context(model, enc, 4)
    slots = torch.tensor([[10, 12, 11], [13, 10, 18], [10, 12, 11], [13, 10, 18]])
    tokens = torch.randint(0, CFG.vocab_size, (4, 3), generator=torch.Generator().manual_seed(2))
    scales = torch.tensor([[[1.0], [3.0], [7.0]], [[2.0], [5.5], [0.5]]])
    want = guide(model.step(slots, model.embed(tokens), cache), scales)
    assert not torch.allclose(want, guide(model.step(slots, model.embed(tokens), _context(model, enc, 4)), 4.0))
    assert torch.allclose(fused(slots, tokens, ours, scales), want, atol=1e-4, rtol=1e-4)


def test_a_rows_logits_do_not_depend_on_its_batch():
    model, enc = _model(half=True)
    fused = FusedStep.for_model(model, 1.0)
    slots, tokens = torch.tensor([[8], [9], [10]]), torch.tensor([[3], [5], [7]])
    batch = fused(slots, tokens, _context(model, enc, 3))
    cache = _context(model, enc, 3)
    alone = fused(slots[1:2], tokens[1:2], _one_row(cache, 1))
    assert torch.equal(alone[0], batch[1])  # bit for bit: every sum runs in the same order


def _one_row(cache: KVCache, row: int) -> KVCache:
    one = KVCache(CFG, 1)
    one.k, one.v = [k[row:row + 1].clone() for k in cache.k], [v[row:row + 1].clone() for v in cache.v]
    one.filled = cache.filled[row:row + 1].clone()
    return one


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_fused_draw_is_the_draw(temperature):
    """Same keyed noise, same warping: the same tokens as sampling.draw on thousands of random distributions."""
    fused = FusedStep.for_model(_model(half=False)[0], 2.0)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 8, CFG.vocab_size, generator=g) * 4
    images, positions = torch.randint(0, 10**6, (32,), generator=g), torch.randint(0, 16, (32, 8), generator=g)
    want = draw(logits, Warpers(temperature=temperature), 5, images, positions)
    assert torch.equal(fused.draw(logits, temperature, 5, images, positions), want)
    assert fused.draws(Warpers(temperature=temperature))
    assert not any(fused.draws(w) for w in (Warpers(temperature=0), Warpers(top_k=5), Warpers(top_p=0.9)))


@pytest.mark.slow
def test_compiled_decodes_give_the_eager_tokens_in_float32():
    """compile=true in float32 runs the fused step for ar's one-token writes and ZipAR's narrow ones, and the
    inductor graph for the rest (wider writes, larger batches): the same tokens as eager (the logits differ by
    rounding only, far from a tie at these sizes), and an image the same alone and in a batch."""
    model, enc = _model(half=True)
    eager, _ = decode_ar(ARBackbone(model, enc, 2.0), CAPS, seed=3)
    bb = ARBackbone(model, enc, 2.0, compile=True)
    assert bb._fused is not None
    compiled, _ = decode_ar(bb, CAPS, seed=3)
    assert torch.equal(compiled, eager)
    alone, _ = decode_ar(bb, CAPS[2:], seed=3, image_ids=torch.tensor([2]))
    assert torch.equal(alone[0], compiled[2])
    # nine images are eighteen rows with guidance: more input vectors than the fused step takes, so the graph
    # runs, and the first three images are still the ones drawn three at a time
    assert not bb._fused.covers(2 * 9, 1) and bb._fused.covers(2 * 3, 1)
    many, _ = decode_ar(bb, CAPS * 3, seed=3)
    assert torch.equal(many[:3], compiled)
    eager_zipar, _ = decode_zipar(ARBackbone(model, enc, 2.0), CAPS, window=2, seed=3)
    assert torch.equal(decode_zipar(bb, CAPS, window=2, seed=3)[0], eager_zipar)
    # a guidance schedule's per-token scales through the fused step and the graph alike
    linear = {"cfg_scale": 2.0, "cfg_schedule": "linear"}
    eager, _ = decode_zipar(ARBackbone(model, enc, **linear), CAPS * 3, window=2, seed=3)
    assert torch.equal(decode_zipar(ARBackbone(model, enc, compile=True, **linear), CAPS * 3, window=2, seed=3)[0],
                       eager)
    eager, _ = decode_ar(ARBackbone(model, enc, **linear), CAPS, seed=3)
    assert torch.equal(decode_ar(ARBackbone(model, enc, compile=True, **linear), CAPS, seed=3)[0], eager)
    # unguided (scale 1: no null rows) through the graph, eighteen rows
    eager, _ = decode_zipar(ARBackbone(model, enc, 1.0), CAPS * 6, window=2, seed=3)
    assert torch.equal(decode_zipar(ARBackbone(model, enc, 1.0, compile=True), CAPS * 6, window=2, seed=3)[0], eager)


def test_models_it_does_not_cover_fall_back_to_the_graph():
    model, _ = _model(half=False)
    assert FusedStep.for_model(model.double(), 2.0) is None  # float64
    learned = Transformer(TransformerConfig(**{**CFG.__dict__, "positions": "learned"}))
    assert FusedStep.for_model(learned, 2.0) is None
    odd = Transformer(TransformerConfig(**{**CFG.__dict__, "dim": 36, "heads": 3}))  # head width 12
    assert FusedStep.for_model(odd, 2.0) is None
    fused = FusedStep.for_model(Transformer(CFG), 1.0)
    with pytest.raises(ValueError, match="at most"):
        fused(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long), KVCache(CFG, 1))


def test_a_failed_build_is_logged_once_with_the_compilers_message(tmp_path, monkeypatch, caplog):
    from mulosd.ar import fused

    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'fused_step.c:1:1: error: no vector unit here' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setattr(fused, "USER_CACHE", tmp_path / "cache")
    monkeypatch.setattr(fused, "_LIB", None)
    with caplog.at_level("WARNING", logger="mulosd.ar.fused"):
        assert fused.library() is None and fused.library() is None  # the second call does not build again
    said = [r.getMessage() for r in caplog.records if "did not build" in r.getMessage()]
    assert len(said) == 1 and "no vector unit here" in said[0] and "exited 1" in said[0], said


def test_coverage_is_what_the_c_step_computes():
    from mulosd.ar.fused import REQUIREMENTS, FusedStep

    def model(**kw):
        torch.manual_seed(0)
        return Transformer(TransformerConfig(**{"vocab_size": 64, "grid": 4, "dim": 32, "layers": 1, "heads": 2,
                                                "cond_dim": 8} | kw)).eval()

    assert all(holds(model()) for _, holds in REQUIREMENTS)
    assert not dict(REQUIREMENTS)["float32 weights on the CPU"](model().double())
    assert FusedStep.for_model(model(vocab_size=63), 2.0) is None  # the vocabulary's vector width
