"""The decode step of a few tokens per row as one C call (fused_step.c), for the CPU path of `compile=true`.

A one-token step of the zoo's verifier computes some 14 MFLOP and must read its 12 MB of weights: bound by
memory, not arithmetic. Compiled by inductor it still spends most of its time in library matrix products on
2-row inputs, which read the weights at a fraction of the bandwidth a plain streaming loop gets, and in one
call per operator (docs/log.md). The C step reads each weight matrix once for all the step's input vectors
and does the rest of the layer in the same pass.

The library is built on first use with the machine's C compiler for the machine's own instruction set
(`-march=native`) into paths.USER_CACHE (keyed by the source, the flags and the CPU), and loaded with ctypes;
a failed build is logged once with the compiler's message. Where there is no library, or for a model that does
not meet REQUIREMENTS (what the C code computes), `FusedStep.for_model` returns None and the backbone uses the
inductor graph instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..paths import USER_CACHE
from .noise import GUMBEL
from .sampling import Warpers
from .transformer import KVCache, Transformer

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("fused_step.c")
# no fast-math: the vector loops are written out (fused_step.c), and the draw must round as the library does
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno"]
# The C step streams the weights once per step but multiplies on one thread, so it wins while a step has few
# input vectors (rows x tokens) and the library's two-thread matrix products win beyond (docs/log.md):
MAX_TOKENS = 4  # per row: wider writes (verification of long drafts) go to the inductor graph
MAX_INPUTS = 16  # rows x tokens, guidance's null rows included: larger batches go to the inductor graph
_LIB: ctypes.CDLL | None | bool = None  # False: the build failed once in this process


def _hidden(model: Transformer) -> int:
    return model.blocks[0].mlp.down.weight.shape[1]


# What the C step computes (fused_step.c), each a test on the model: a model that passes all of them decodes the
# same through it as through the graph (tests/test_fused.py), any other runs the graph.
REQUIREMENTS = (
    ("rotary positions", lambda m: m.cfg.positions == "rope"),
    ("float32 weights on the CPU", lambda m: all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (
        *m.parameters(), *([m.rope] if m.rope is not None else [])))),
    ("bias-free layers", lambda m: all(getattr(x, "bias", None) is None for b in m.blocks for x in b.modules())),
    ("widths of whole vectors (dim, head and hidden sizes in 8s, vocabulary in 4s)", lambda m: not (
        m.cfg.dim % 8 or (m.cfg.dim // m.cfg.heads) % 8 or _hidden(m) % 8 or m.cfg.vocab_size % 4)),
)


class _Model(ctypes.Structure):
    _fields_ = [(k, ctypes.c_int) for k in ("dim", "heads", "hidden", "vocab", "slots", "layers", "half")] + [
        ("eps", ctypes.c_float)] + [(k, ctypes.c_void_p) for k in ("tok_emb", "rope", "norm", "head")] + [
        (k, ctypes.POINTER(ctypes.c_void_p)) for k in ("attn_norm", "mlp_norm", "qkv", "out", "gate_up", "down")]


MATRICES = ("qkv", "out", "gate_up", "down")  # per layer; with the head, what the step streams


def _cpu_tag() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def library() -> ctypes.CDLL | None:
    """The compiled step, built once per source, flags and CPU; None where no C compiler can build it."""
    global _LIB
    if _LIB is None:
        _LIB = _build() or False
    return _LIB or None


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or platform.system() != "Linux":
        log.info("compile=true: no C compiler (or not Linux), so the decode step runs as an inductor graph")
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + _cpu_tag().encode()).hexdigest()[:16]
    so = USER_CACHE / f"fused_step-{key}.so"
    if not so.exists():
        USER_CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=USER_CACHE) as tmp:  # built aside, then renamed: never half a library
            out = Path(tmp) / so.name
            r = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(out), "-lm"], capture_output=True, text=True)
            if r.returncode != 0:  # once per process (library() remembers): the compiler's own first lines
                message = " | ".join((r.stderr or r.stdout).strip().splitlines()[:3])
                log.warning(f"the C decode step did not build ({cc} exited {r.returncode}: {message}); compile=true "
                            "runs the inductor graph instead")
                return None
            os.replace(out, so)
    lib = ctypes.CDLL(str(so))
    lib.mulosd_step.restype = None
    lib.mulosd_step.argtypes = [ctypes.POINTER(_Model), ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.mulosd_draw.restype = None
    lib.mulosd_draw.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p]
    return lib


def _ptrs(tensors) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))


class FusedStep:
    """`guide(model.step(slots, model.embed(tokens), cache), scale)` for up to MAX_TOKENS tokens per row,
    as one C call. Holds pointers into the model's weights: they must stay where they are (no `.to()`)."""

    def __init__(self, lib: ctypes.CDLL, model: Transformer, cfg_scale: float):
        cfg = model.cfg
        self.lib, self.model, self.cfg_scale = lib, model, float(cfg_scale)
        blocks = list(model.blocks)
        matrices = {"qkv": [b.attn.qkv.weight for b in blocks], "out": [b.attn.out.weight for b in blocks],
                    "gate_up": [b.mlp.gate_up.weight for b in blocks], "down": [b.mlp.down.weight for b in blocks],
                    "head": [model.head.weight]}
        # an exported model's weights are float16 values (the zoo stores them so): streamed as float16 they are
        # the same numbers in half the bytes; anything else is streamed as it is
        half = bool(lib.mulosd_has_f16()) and all(torch.equal(w.half().float(), w) for ws in matrices.values()
                                                  for w in ws)
        self._keep = {k: [(w.detach().half() if half else w.detach()).contiguous() for w in ws]
                      for k, ws in matrices.items()}  # the tensors whose addresses the struct holds
        self._keep |= {"attn_norm": [b.attn_norm.weight for b in blocks],
                       "mlp_norm": [b.mlp_norm.weight for b in blocks]}
        self._arrays = {k: _ptrs(v) for k, v in self._keep.items()}
        self.hidden = _hidden(model)
        self.vocab = cfg.vocab_size
        self.struct = _Model(cfg.dim, cfg.heads, self.hidden, cfg.vocab_size, cfg.slots, cfg.layers, int(half),
                             blocks[0].attn_norm.eps, model.tok_emb.weight.data_ptr(), model.rope.data_ptr(),
                             model.norm.weight.data_ptr(), self._keep["head"][0].data_ptr(),
                             *(ctypes.cast(self._arrays[k], ctypes.POINTER(ctypes.c_void_p))
                               for k in ("attn_norm", "mlp_norm", *MATRICES)))
        self._scratch = torch.empty(0)
        self._constant, self._constant_value = torch.empty(0), None  # one scale per token, kept between steps
        self._cache_ptrs: tuple[int, ctypes.Array, ctypes.Array] | None = None

    @classmethod
    def for_model(cls, model: Transformer, cfg_scale: float) -> FusedStep | None:
        """The fused step for this model, or None where it does not apply (then the inductor graph runs)."""
        missing = [what for what, holds in REQUIREMENTS if not holds(model)]
        if missing:
            log.debug(f"the C decode step does not cover this model: it needs {', '.join(missing)}")
            return None
        lib = library()
        return None if lib is None else cls(lib, model, cfg_scale)

    @staticmethod
    def covers(rows: int, n: int) -> bool:
        """Whether a write of n tokens in each of `rows` rows is the fused step's to run (else the graph's)."""
        return 0 < n <= MAX_TOKENS and rows * n <= MAX_INPUTS

    def draws(self, warpers: Warpers) -> bool:
        """Whether `draw` covers these warpers: temperature only (top-k and top-p off), not greedy."""
        return warpers.temperature > 0 and (warpers.top_k == 0 or warpers.top_k >= self.vocab) and warpers.top_p == 1

    def draw(self, logits: torch.Tensor, temperature: float, seed: int, images: torch.Tensor,
             positions: torch.Tensor) -> torch.Tensor:
        """`sampling.draw(logits [B, n, V], Warpers(temperature), seed, images [B], positions [B, n])` as one C
        call: tokens [B, n], the same but where two candidates tie to the last bit (fused_step.c)."""
        B, n, V = logits.shape
        logits = logits.float().contiguous()
        images, positions = images.long().contiguous(), positions.long().contiguous()
        if self._scratch.numel() < V:
            self._scratch = torch.empty(V)
        tokens = torch.empty(B, n, dtype=torch.long)
        self.lib.mulosd_draw(logits.data_ptr(), B, n, V, temperature, seed, GUMBEL, images.data_ptr(),
                             positions.data_ptr(), self._scratch.data_ptr(), tokens.data_ptr())
        return tokens

    def __call__(self, slots: torch.Tensor, tokens: torch.Tensor, cache: KVCache,
                 scale: float | torch.Tensor | None = None) -> torch.Tensor:
        """`scale`: the guidance scale, one for all tokens or one per token ([R / 2, n, 1]); None: cfg_scale."""
        R, n = slots.shape
        if cache.k[0].dtype != torch.float32 or n > MAX_TOKENS:
            raise ValueError("the fused step takes an fp32 cache and at most MAX_TOKENS tokens per row")
        m, d, S = R * n, self.model.cfg.dim, self.model.cfg.slots
        need = m * (6 * d + 3 * self.hidden + self.vocab) + S
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need)
        if self._cache_ptrs is None or self._cache_ptrs[0] is not cache:
            self._cache_ptrs = (cache, _ptrs(cache.k), _ptrs(cache.v))
        _, k, v = self._cache_ptrs
        guided = self.cfg_scale != 1.0
        logits = torch.empty(R // 2 if guided else R, n, self.vocab)
        if isinstance(scale, torch.Tensor):  # one scale per conditional token
            scales = scale.float().reshape(-1).contiguous()
        else:
            value = self.cfg_scale if scale is None else float(scale)
            if self._constant.numel() < m or self._constant_value != value:
                self._constant, self._constant_value = torch.full((m,), value), value
            scales = self._constant
        slots, tokens = slots.contiguous(), tokens.contiguous()
        self.lib.mulosd_step(ctypes.byref(self.struct), R, n, slots.data_ptr(), tokens.data_ptr(), k, v,
                             cache.filled.data_ptr(), scales.data_ptr(), int(guided), self._scratch.data_ptr(),
                             logits.data_ptr())
        return logits
