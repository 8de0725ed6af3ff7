"""Decoding strategies over one ARBackbone call; each returns tokens and a Trace (DESIGN §6)."""

from .ar import decode_ar
from .mulosd import MuLoSDConfig, decode_mulosd
from .trace import Round, Trace

__all__ = ["MuLoSDConfig", "Round", "Trace", "decode_ar", "decode_mulosd"]
