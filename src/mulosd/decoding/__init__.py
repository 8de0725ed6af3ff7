"""Decoding strategies over one ARBackbone call; each returns tokens and a Trace."""

from .ar import decode_ar
from .mulosd import MuLoSDConfig, decode_mulosd
from .sd import SDConfig, decode_sd
from .trace import Round, Trace
from .zipar import decode_zipar

# every strategy, in the order tables list them (mulosd.pipeline.STRATEGIES runs them)
STRATEGY_NAMES = ("ar", "zipar", "sd", "lantern", "mulosd")

__all__ = ["STRATEGY_NAMES", "MuLoSDConfig", "Round", "SDConfig", "Trace", "decode_ar", "decode_mulosd", "decode_sd",
           "decode_zipar"]
