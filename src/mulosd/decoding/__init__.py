"""Decoding strategies over one ARBackbone call; each returns tokens and a Trace."""

from .ar import decode_ar
from .knobs import KnobError, from_config
from .mulosd import MuLoSDConfig, decode_mulosd
from .sd import SDConfig, decode_sd
from .sjd import SJDConfig, decode_sjd
from .trace import Round, Trace
from .zipar import ZipARConfig, decode_zipar

# every strategy, in the order tables list them (mulosd.pipeline.STRATEGIES runs them), with the dataclass of its
# own settings (None: it has none)
STRATEGY_CONFIGS = {"ar": None, "zipar": ZipARConfig, "sd": SDConfig, "lantern": SDConfig, "sjd": SJDConfig,
                    "mulosd": MuLoSDConfig}
STRATEGY_NAMES = tuple(STRATEGY_CONFIGS)

__all__ = ["STRATEGY_CONFIGS", "STRATEGY_NAMES", "KnobError", "MuLoSDConfig", "Round", "SDConfig", "SJDConfig",
           "Trace", "ZipARConfig", "decode_ar", "decode_mulosd", "decode_sd", "decode_sjd", "decode_zipar",
           "from_config"]
