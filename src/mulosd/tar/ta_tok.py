"""TA-Tok's decode-to-features path: the LLM's TA-Tok ids -> SigLIP2-width features that condition AR-DTok.

ids [B, n] -> SimVQ codebook (an embedding through a linear projection, L2-normalised when the checkpoint says
so) -> the bottleneck's output linear (its own width to its own width) -> a p x p grid through a small SigLIP2
vision transformer used as a decoder (patch size 1, input channels = the bottleneck width, hidden = the
encoder's width) -> Linear, Tanh, Linear -> features [B, n, 1152]. Only this path is loaded from
`ta_tok.pth`; the image encoder it also holds (SigLIP2-so400m) is never built. Needs `transformers`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..llamagen.checkpoints import read_spec

FILE = "ta_tok.pth"
# what ta_tok.pth holds for encoding images only: skipped, never an error
ENCODE_ONLY = ("encoder.", "encode_task_layer.", "bottleneck.in_linear.", "scale_layer.", "teacher.")


def siglip2_decoder(bottleneck_dim: int, hidden: int, depth: int, **overrides):
    """Upstream's decoder: SigLIP2's default vision config with patch size 1, `depth` layers, the bottleneck
    width in and `hidden` wide; `overrides` (heads, MLP width, patches) shrink it for tests."""
    try:
        from transformers import Siglip2VisionConfig, Siglip2VisionModel
    except ImportError:
        raise ImportError("TA-Tok's decoder needs `pip install transformers` (Siglip2VisionModel)") from None
    config = Siglip2VisionConfig()
    config.update({"patch_size": 1, "num_hidden_layers": depth, "num_channels": bottleneck_dim,
                   "hidden_size": hidden} | overrides)
    return Siglip2VisionModel(config)


class TATokDecoder(nn.Module):
    def __init__(self, codebook_size: int, bottleneck_dim: int, hidden: int, depth: int = 3,
                 l2_normalized: bool = False, **decoder_overrides):
        super().__init__()
        self.l2_normalized = l2_normalized
        self.embedding = nn.Embedding(codebook_size, bottleneck_dim)
        self.embedding_proj = nn.Linear(bottleneck_dim, bottleneck_dim)
        self.out_linear = nn.Linear(bottleneck_dim, bottleneck_dim)  # the bottleneck's output_dim is its own width
        self.decoder = siglip2_decoder(bottleneck_dim, hidden, depth, **decoder_overrides)
        self.decode_task_layer = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden))

    @property
    def codebook_size(self) -> int:
        return self.embedding.num_embeddings

    @property
    def hidden(self) -> int:
        """The features' width (SigLIP2-so400m's 1152)."""
        return self.decode_task_layer[2].out_features

    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """TA-Tok ids [B, n] (n a square: 729, 169, 81) -> features [B, n, hidden]."""
        B, n = ids.shape
        p = round(n ** 0.5)
        if p * p != n:
            raise ValueError(f"{n} TA-Tok ids are not a square grid")
        if ids.min() < 0 or ids.max() >= self.codebook_size:
            raise ValueError(f"TA-Tok ids must be in [0, {self.codebook_size})")
        # projecting only the looked-up rows equals looking up rows of the projected codebook
        z = self.embedding_proj(self.embedding(ids.to(self.embedding.weight.device)))
        if self.l2_normalized:
            z = F.normalize(z, p=2, dim=-1)
        z = self.out_linear(z)
        mask = torch.ones(B, n, dtype=torch.int, device=z.device)
        shapes = torch.tensor([[p, p]] * B, device=z.device)
        z = self.decoder(z, mask, shapes).last_hidden_state
        return self.decode_task_layer(z)


# upstream ta_tok.pth key prefix -> ours, for the decode path
PREFIXES = {"bottleneck.regularizer.embedding.": "embedding.",
            "bottleneck.regularizer.embedding_proj.": "embedding_proj.", "bottleneck.out_linear.": "out_linear.",
            "decoder.": "decoder.", "decode_task_layer.": "decode_task_layer."}


def _rename(key: str, table: dict[str, str]) -> str | None:
    return next((table[p] + key.removeprefix(p) for p in table if key.startswith(p)), None)


def load_ta_tok(path: Path, device="cpu", **decoder_overrides) -> TATokDecoder:
    """The decode path of an upstream `ta_tok.pth` ({"model": {"args", "sd"}}), read weights-only and strictly:
    a missing or misshapen key is refused by name, as is any key that is neither decode path nor encoder."""
    spec = read_spec(path, {"args", "sd"}, "a TA-Tok checkpoint")
    args, sd = spec["args"], spec["sd"]
    ours = {_rename(k, PREFIXES): v for k, v in sd.items() if _rename(k, PREFIXES)}
    extra = sorted(k for k in sd if not _rename(k, PREFIXES) and not k.startswith(ENCODE_ONLY))
    if extra:
        raise ValueError(f"TA-Tok checkpoint has keys this loader does not know: {extra[:5]}")
    upstream = {v: k for k, v in PREFIXES.items()}
    for key in ("embedding.weight", "decode_task_layer.0.weight"):
        if key not in ours:
            raise ValueError(f"TA-Tok checkpoint lacks {_rename(key, upstream)!r}")
    regularizer = args.get("bottleneck", {}).get("args", {}).get("regularizer", {}).get("args", {})
    codes, dim = ours["embedding.weight"].shape
    hidden = ours["decode_task_layer.0.weight"].shape[0]
    depth = int(args.get("decoder_depth", 3))
    layer = "decoder.vision_model.encoder.layers.0.mlp.fc1.weight"
    sizes = {"intermediate_size": ours[layer].shape[0]} if layer in ours else {}
    pos = "decoder.vision_model.embeddings.position_embedding.weight"
    sizes |= {"num_patches": ours[pos].shape[0]} if pos in ours else {}
    model = TATokDecoder(codes, dim, hidden, depth, bool(regularizer.get("l2_normalized", False)),
                         **(sizes | decoder_overrides))
    missing = sorted(set(model.state_dict()) - set(ours))
    if missing:
        raise ValueError(f"TA-Tok checkpoint lacks {_rename(missing[0], upstream)!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    try:
        model.load_state_dict(ours)
    except RuntimeError as e:
        raise ValueError(f"TA-Tok checkpoint does not fit its decoder ({' '.join(str(e).split())[:240]})") from None
    return model.eval().to(device)
