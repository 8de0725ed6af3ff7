import warnings

import numpy as np
import pytest
import torch
from skimage import data

from mulosd.losses import (
    ImageLoss,
    ImageLossConfig,
    NLayerDiscriminator,
    adaptive_weight,
    build_lpips,
    hinge_d_loss,
    hinge_g_loss,
    nonsaturating_d_loss,
    nonsaturating_g_loss,
    warmup_factor,
)
from mulosd.losses.lpips_offline import load_numpy_pickle


def test_hinge_and_nonsaturating_losses_by_hand():
    real = torch.tensor([2.0, 0.5, -1.0])
    fake = torch.tensor([-2.0, 0.0, 0.5])
    # hinge D: 0.5 * (mean(relu(1 - real)) + mean(relu(1 + fake))) = 0.5 * ((0 + .5 + 2)/3 + (0 + 1 + 1.5)/3)
    assert hinge_d_loss(real, fake).item() == pytest.approx(0.5 * (2.5 / 3 + 2.5 / 3))
    assert hinge_g_loss(fake).item() == pytest.approx(-(-2.0 + 0.0 + 0.5) / 3)
    sp = lambda x: float(np.log1p(np.exp(x)))  # noqa: E731
    want_d = 0.5 * (np.mean([sp(-2.0), sp(-0.5), sp(1.0)]) + np.mean([sp(-2.0), sp(0.0), sp(0.5)]))
    assert nonsaturating_d_loss(real, fake).item() == pytest.approx(want_d, rel=1e-6)
    assert nonsaturating_g_loss(fake).item() == pytest.approx(np.mean([sp(2.0), sp(0.0), sp(-0.5)]), rel=1e-6)


def test_warmup_boundary_is_counted_in_batches():
    assert warmup_factor(99, 100) == 0.0
    assert warmup_factor(100, 100) == 1.0
    assert warmup_factor(0, 0) == 1.0


def test_adaptive_weight_is_the_gradient_norm_ratio_and_clamps():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    rec = (3.0 * w).sum()  # d/dw = [3, 3], norm 3*sqrt(2)
    g = (0.5 * w).sum()  # d/dw = [.5, .5], norm .5*sqrt(2)
    assert adaptive_weight(rec, g, w).item() == pytest.approx(3.0 / (0.5 + 1e-4 / np.sqrt(2)), rel=1e-4)
    assert adaptive_weight(rec, g, w, max_weight=2.0).item() == 2.0
    tiny = (1e-9 * w).sum()
    assert adaptive_weight(rec, tiny, w).item() == pytest.approx(1e4)  # default clamp at 1e4


def _t(x):
    return torch.from_numpy(x.astype(np.float32) / 127.5 - 1).permute(2, 0, 1)[None]


def test_offline_lpips_reproduces_known_values():
    """LPIPS(alex, v0.1) with the real ImageNet trunk, offline, against the published values; building it
    warns about nothing (torchvision's deprecation of the lpips package's `pretrained=` is filtered there)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = build_lpips("alex")
    assert not [str(w.message) for w in caught]
    ast, che, cof = data.astronaut()[:256, :256], data.chelsea()[:256, :256], data.coffee()[:256, :256]
    with torch.no_grad():
        assert m(_t(ast), _t(np.roll(ast, 4, axis=1))).item() == pytest.approx(0.0893, abs=1e-3)
        assert m(_t(ast), _t(che)).item() == pytest.approx(0.7397, abs=1e-3)
        assert m(_t(cof), _t(cof) * 0.8).item() == pytest.approx(0.0173, abs=1e-3)


def test_writing_the_trunk_cache_leaves_the_global_rng_alone(tmp_path):
    """The run that writes the cache must initialise its models as every later run with its seed does (the
    reliability battery caught a fresh clone's first GAN run diverging from its resumed twin)."""
    from mulosd.losses.lpips_offline import ensure_trunk

    torch.manual_seed(0)
    ensure_trunk("alex", tmp_path)
    after = torch.rand(4)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(4))


def test_numpy_only_unpickler_refuses_code():
    import pickle

    class Evil:
        def __reduce__(self):
            return (eval, ("1+1",))

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_numpy_pickle(pickle.dumps({"k": Evil()}))
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(load_numpy_pickle(pickle.dumps({"a": arr}))["a"], arr)


def test_image_loss_switches_gan_on_at_disc_start():
    loss = ImageLoss(ImageLossConfig(lpips_weight=0.0, gan="hinge", disc_start=5, disc_ndf=8))
    real = torch.rand(2, 3, 32, 32) * 2 - 1
    last = torch.nn.Conv2d(3, 3, 1)
    fake = last(real + 0.1)
    before, logs = loss.generator_loss([real], [fake], last.weight, batches_seen=4)
    assert "g_loss" not in logs and before.item() == pytest.approx((fake - real).abs().mean().item())
    after, logs = loss.generator_loss([real], [fake], last.weight, batches_seen=5)
    assert "g_loss" in logs and logs["adaptive_weight"] > 0
    expected = before + 0.1 * logs["adaptive_weight"] * logs["g_loss"]
    assert after.item() == pytest.approx(expected.item(), rel=1e-5)
    d, _ = loss.discriminator_loss([real], [fake])
    d.backward()
    assert all(p.grad is not None for p in loss.discriminator.parameters())


def test_patchgan_gives_one_logit_per_patch():
    d = NLayerDiscriminator(3, 16, 2)
    assert d(torch.zeros(1, 3, 64, 64)).shape == (1, 1, 14, 14)
