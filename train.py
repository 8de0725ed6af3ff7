"""Train a mulosd model: python train.py [experiment=NAME] [group=option ...] [key=value ...]"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mulosd.config import check_group_choices, check_model_chosen, exit_on_config_error
from mulosd.config.train import register

register()
with exit_on_config_error():
    check_group_choices(sys.argv[1:])
    check_model_chosen(sys.argv[1:])


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from mulosd.logs import configure
    from mulosd.training import run

    configure()
    with exit_on_config_error():
        run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
