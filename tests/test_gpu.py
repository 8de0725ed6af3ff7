"""The CUDA path (run by scripts/gpu_check.sh; skipped without a GPU): bf16 decoding agrees with fp32 on the
CPU, every strategy runs on the device with CFG and batch > 1, the compiled step (CUDA graphs) changes no
token, and compiled bf16 training of a multi-resolution model gives the eager loss."""

import pytest
import torch

from mulosd.ar import ARBackbone
from mulosd.data.synthscenes.encoder import SceneCaptionEncoder
from mulosd.decoding.ar import decode_ar

from .test_device_path import CAPS, CASES, V, decodes, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_bf16_cached_logits_agree_with_fp32_on_the_cpu():
    model, enc = tiny_model(8), SceneCaptionEncoder(16).eval()
    pos = torch.arange(63)[None].expand(2, -1)
    toks = torch.randint(0, 64, (2, 63), generator=torch.Generator().manual_seed(1))
    want = ARBackbone(model, enc, 3.0)
    want.start(CAPS)
    want = want(pos, toks)
    gpu = ARBackbone(model.to("cuda", torch.bfloat16), enc.to("cuda"), 3.0)
    gpu.start(CAPS)
    got = gpu(pos.cuda(), toks.cuda()).cpu()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95
    torch.testing.assert_close(got.softmax(-1), want.softmax(-1), atol=2e-2, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_every_strategy_runs_on_the_gpu_in_bf16(case):
    """test_device_path.py's decodes (every strategy, CFG, batch 2, host image ids) on the real device."""
    _, _, run = next(c for c in decodes(torch.bfloat16, "cuda") if c[0] == case)
    tokens, _ = run()
    assert tokens.shape == (2, 8, 8) and tokens.is_cuda and 0 <= int(tokens.min()) <= int(tokens.max()) < V


def test_the_compiled_step_with_cuda_graphs_changes_no_token():
    """compile=true on the device (torch.compile with CUDA graphs): plain AR and SJD give the eager tokens in
    fp32 (bf16 rounding could flip a near-tie; fp32 keeps the comparison exact to the noise)."""
    from mulosd.decoding import SJDConfig
    from mulosd.decoding.sjd import decode_sjd

    verifier, enc = tiny_model(8).cuda(), SceneCaptionEncoder(16).eval().cuda()
    eager, _ = decode_ar(ARBackbone(verifier, enc, 3.0), CAPS, seed=1)
    compiled, _ = decode_ar(ARBackbone(verifier, enc, 3.0, compile=True), CAPS, seed=1)
    assert torch.equal(eager, compiled)
    eager, _ = decode_sjd(ARBackbone(verifier, enc, 3.0), CAPS, SJDConfig(window=4), seed=1)
    compiled, _ = decode_sjd(ARBackbone(verifier, enc, 3.0, compile=True), CAPS, SJDConfig(window=4), seed=1)
    assert torch.equal(eager, compiled)


def test_compiled_training_of_a_multi_resolution_model_runs_in_bf16():
    """model.compile=true on the device, as zoo_gpu.sh trains: both grids' compiled forward and backward under
    bf16 autocast give the eager loss and gradients (a symbolic sequence length once failed in inductor's
    backward here, on the second grid's first batch)."""
    from .test_ar import _captions, _module

    torch.manual_seed(1)
    batch = {"tokens": {32: torch.randint(0, 48, (4, 4, 4)).cuda(), 16: torch.randint(0, 48, (4, 2, 2)).cuda()},
             "caption": _captions(4)}
    drop = torch.tensor([False, True, False, False]).cuda()
    runs = []
    for compiled in (False, True):
        m = _module(grids=(2, 4), resolutions=[16, 32], compile=compiled).cuda().train()
        for _ in range(2):  # the second call of each grid's graph too
            m.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m.loss(batch, drop)
            loss.backward()
        runs.append((loss.detach(), [p.grad.float() for p in m.model.parameters()]))
    (l0, g0), (l1, g1) = runs
    torch.testing.assert_close(l1, l0, atol=2e-2, rtol=0)
    assert all(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0) > 0.99
               for a, b in zip(g0, g1, strict=True) if a.abs().sum() > 0)
