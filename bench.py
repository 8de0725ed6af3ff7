"""Benchmark every decoding strategy on the same prompts and seeds: python bench.py [taus=[...] rs=[2,4] ...]"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mulosd.config import check_group_choices, exit_on_config_error
from mulosd.config.bench import register, validate_bench

register()  # its schema only: --help and a config error load no torch
with exit_on_config_error():
    check_group_choices(sys.argv[1:])


@hydra.main(version_base="1.3", config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    with exit_on_config_error():
        validate_bench(cfg)  # before torch loads
        from mulosd.bench import run
        from mulosd.logs import configure

        configure()
        run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
