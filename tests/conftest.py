import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from mulosd.config import register_configs
from mulosd.data.synthscenes.shards import write_split

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("WANDB_MODE", "disabled")
register_configs()


def compose_config(name: str, overrides=()):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture(scope="session")
def synth_shards(tmp_path_factory) -> Path:
    """Two small SynthScenes shards of 64 px scenes (16 each)."""
    out = tmp_path_factory.mktemp("shards")
    write_split(out, "train", 2, 16, 64, seed=3, workers=1, progress=False)
    return out
