"""Generate images: python infer.py prompt="a red circle above a blue square on a striped green background" """

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mulosd.config import check_group_choices, exit_on_config_error
from mulosd.config.infer import register, validate_infer

register()  # its schema only: --help and a config error load no torch
with exit_on_config_error():
    check_group_choices(sys.argv[1:])


@hydra.main(version_base="1.3", config_path="conf", config_name="infer")
def main(cfg: DictConfig) -> None:
    with exit_on_config_error():
        validate_infer(cfg)  # before torch loads
        from mulosd.inference import run
        from mulosd.logs import configure

        configure()
        run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
