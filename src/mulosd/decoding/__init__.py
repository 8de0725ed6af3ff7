"""Decoding strategies over one ARBackbone call; each returns tokens and a Trace (DESIGN §6)."""

from .ar import decode_ar
from .trace import Round, Trace

__all__ = ["Round", "Trace", "decode_ar"]
