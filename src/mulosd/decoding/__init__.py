"""Decoding strategies over one ARBackbone call; each returns tokens and a Trace.

The package imports no torch: `knobs` (every strategy's settings) and `registry` (every strategy) are read by
the config schemas; the decoders are imported from their modules (`from mulosd.decoding.mulosd import
decode_mulosd`).
"""

from .knobs import MuLoSDConfig, PJDConfig, SDConfig, SJDConfig, ZipARConfig, from_config
from .registry import STRATEGIES, STRATEGY_NAMES, Strategy

__all__ = ["STRATEGIES", "STRATEGY_NAMES", "MuLoSDConfig", "PJDConfig", "SDConfig", "SJDConfig",
           "Strategy", "ZipARConfig", "from_config"]
