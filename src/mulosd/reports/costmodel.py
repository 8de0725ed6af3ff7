"""The GPU cost model of MuLo-SD on the released backbones' shapes, without weights.

Randomly initialised models in bf16, random latent samplers on a random normalised codebook:
- `xl`: LlamaGen GPT-XL verifier (512 px, 32x32 tokens) and drafter (256 px, 16x16), 120 caption slots;
- `tar512` / `tar1024`: Tar's AR-DTok-LP verifier (512 px, 32x32; 1024 px, 64x64) over the 256 px drafter,
  729 TA-Tok feature slots (r = 2 and 4);
16384 VQ-16 codes throughout. Besides the weights and the KV cache per image (with CFG), measured at batch 1:
- one AR step (one token against a half-full KV cache);
- one whole-image verification forward;
- decoding one image with `ar` and with `mulosd` (r = 2, infer.py's knobs: MuLoSDConfig's defaults) at forced
  acceptance rates: the acceptance test is replaced by a coin per drafted token (rate 1.0, 0.97, 0.9), so
  rejection islands fall at random. The
  speed-up at a rate is what the loop's structure allows when the verifier accepts that share of the draft.

    python -m mulosd.reports.costmodel --device cuda --out docs/gpu_cost   # -> .json + .md
    python -m mulosd.reports.costmodel --size tar1024 --rates ''           # steps and memory only
    python -m mulosd.reports.costmodel --size tiny                          # the harness itself, on CPU

Random weights make the verifier's distribution flat, so sampled tokens and resampling lengths differ from a
trained model's; latencies and the loop's step structure do not depend on the weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import torch

from ..ar import ARBackbone, Transformer, Warpers
from ..decoding.ar import decode_ar
from ..decoding.knobs import MuLoSDConfig
from ..decoding.mulosd import decode_mulosd
from ..llamagen.gpt import CAPTION_DIM, CAPTION_SLOTS, VOCAB, gpt_config
from ..samplers import LatentDownsampler, LatentUpsampler

# grid / low: the verifier's and the drafter's tokens per side; slots and caption: the condition prefix;
# "tiny" and "tar_tiny" exercise the harness in the test suite
SIZES = {"xl": dict(kind="llamagen", size="GPT-XL", grid=32, low=16, vocab=VOCAB, slots=CAPTION_SLOTS,
                    caption=CAPTION_DIM, width=256, depth=4),
         "tar512": dict(kind="tar", size="llama-abs-LP", grid=32, low=16, vocab=VOCAB, slots=729, caption=1152,
                        width=256, depth=4),
         "tar1024": dict(kind="tar", size="llama-abs-LP", grid=64, low=16, vocab=VOCAB, slots=729, caption=1152,
                         width=256, depth=4),
         "tiny": dict(kind="llamagen", size=(1, 2, 64), grid=8, low=4, vocab=512, slots=8, caption=32, width=16,
                      depth=1),
         "tar_tiny": dict(kind="tar", size=(1, 2, 64), grid=8, low=2, vocab=512, slots=9, caption=32, width=16,
                          depth=1)}
RATES = (1.0, 0.97, 0.9)


class RandomCaptions:
    """Fixed random caption features standing in for FLAN-T5 (all slots visible)."""

    def __init__(self, slots: int, dim: int, device):
        self.prefix, self.dim, self.device = slots, dim, device

    def __call__(self, captions):
        g = torch.Generator().manual_seed(len(captions))
        return torch.randn(len(captions), self.prefix, self.dim, generator=g).to(self.device)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, repeats: int = 5) -> float:
    """Median seconds of fn() after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def forced(rate: float, seed: int = 0):
    """accept(logp, draft) replacing pooled acceptance: each drafted token accepted with probability `rate`."""
    g = torch.Generator().manual_seed(seed)

    def accept(logp, draft):
        return (torch.rand(draft.shape, generator=g) < rate).to(draft.device)

    return accept


def measure(size: str = "xl", device: str = "cuda", dtype: torch.dtype = torch.bfloat16, rates=RATES,
            cfg_scale: float = 7.5) -> dict:
    s = SIZES[size]
    dev = torch.device(device)
    torch.manual_seed(0)
    G, N, r = s["grid"], s["grid"] ** 2, s["grid"] // s["low"]
    verifier, drafter = (_model(s, grid).to(dev, dtype).eval() for grid in (G, s["low"]))
    captions = RandomCaptions(s["slots"], s["caption"], dev)
    codebook = torch.nn.functional.normalize(torch.randn(s["vocab"], 8), dim=-1)
    up = LatentUpsampler(codebook, r, s["width"], s["depth"], head="latent").to(dev).eval()
    down = LatentDownsampler(codebook, r, s["width"], s["depth"]).to(dev).eval()
    knobs = MuLoSDConfig()  # what infer.py ships
    # the pool's codes do not matter (acceptance is forced), its size does: the drafter's pooled mass is computed
    neighbours = torch.zeros(s["vocab"], knobs.pool_k, dtype=torch.long, device=dev)
    warpers = Warpers(1.0, 1000, 1.0)
    bb = lambda m: ARBackbone(m, captions, cfg_scale)  # noqa: E731
    prompt = ["a photo"]
    host = platform.processor() or platform.machine()
    out = {"size": size, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({host})",
           "dtype": str(dtype).removeprefix("torch."), "batch": 1, "cfg_scale": cfg_scale, "tokens": N,
           "r": r, "params_verifier_M": sum(p.numel() for p in verifier.parameters()) / 1e6,
           "knobs": dataclasses.asdict(knobs),
           "memory_gb": {name: {"weights": _bytes(m.parameters()) / 1e9,
                                "kv_cache_per_image": _kv_bytes(m, dtype) / 1e9}
                         for name, m in (("verifier", verifier), ("drafter", drafter))}}
    with torch.no_grad():
        v = bb(verifier)
        v.start(prompt)
        half = torch.arange(N // 2, device=dev)[None]
        v(half, torch.zeros_like(half))  # a half-full cache

        def one_step():
            v(torch.tensor([[N // 2]], device=dev), torch.zeros(1, 1, dtype=torch.long, device=dev))

        def verify_all():
            v.start(prompt)
            pos = torch.arange(N - 1, device=dev)[None]
            v(pos, torch.zeros_like(pos))

        out["ms_ar_step"] = 1e3 * _timed(one_step, dev)
        out["ms_verify_all"] = 1e3 * _timed(verify_all, dev)
        out["mulosd"] = {}
        if not rates:  # steps and memory only (a 1024 px AR decode is minutes of eager steps)
            return out
        ar_s = _timed(lambda: decode_ar(bb(verifier), prompt, warpers=warpers), dev, repeats=1)
        out["s_ar"] = ar_s
        for rate in rates:
            traces = []

            def run(rate=rate, traces=traces):
                traces.append(decode_mulosd(bb(verifier), bb(drafter), up.up, down.down, prompt, neighbours,
                                            knobs, warpers=warpers, accept=forced(rate))[1])

            sec = _timed(run, dev, repeats=1)
            t = traces[-1]
            out["mulosd"][str(rate)] = {"s": sec, "speedup": ar_s / sec, "steps": t.steps,
                                        "verifier_forwards": t.forwards["verifier"],
                                        "resampled": t.counts["resampled"], "drafted": t.counts["drafted"]}
    return out


def _model(s: dict, grid: int) -> Transformer:
    """A randomly initialised verifier or drafter of the size's backbone at a token grid."""
    if s["kind"] == "tar":
        from ..tar.ar_dtok import ardtok_config

        args = {"max_seq_len": grid * grid, "cls_token_num": s["slots"], "vocab_size": s["vocab"],
                "cond_dim": s["caption"]}
        return Transformer(ardtok_config(args, s["size"]))
    return Transformer(gpt_config(s["size"], grid, vocab_size=s["vocab"], prefix=s["slots"], caption_dim=s["caption"]))


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _kv_bytes(model: Transformer, dtype: torch.dtype, guided: bool = True) -> int:
    """Keys and values of every layer for one image's slots (prefix + grid), doubled by CFG's null rows."""
    c = model.cfg
    return 2 * c.layers * c.slots * c.dim * torch.finfo(dtype).bits // 8 * (2 if guided else 1)


def table(m: dict) -> str:
    names = {"xl": "LlamaGen-XL-shaped", "tar512": "Tar AR-DTok-LP-shaped", "tar1024": "Tar AR-DTok-LP-shaped"}
    G = round(m["tokens"] ** 0.5)
    g = G // m["r"]
    mem = m["memory_gb"]
    lines = [f"{names.get(m['size'], m['size'])} random models (r = {m['r']}, {g}x{g} -> {G}x{G} tokens) on "
             f"{m['device']}, {m['dtype']}, batch {m['batch']}, CFG {m['cfg_scale']} (verifier "
             f"{m['params_verifier_M']:.0f}M parameters)", "",
             f"- memory: verifier weights {mem['verifier']['weights']:.2f} GB + KV cache "
             f"{mem['verifier']['kv_cache_per_image']:.2f} GB per image; drafter {mem['drafter']['weights']:.2f} GB + "
             f"{mem['drafter']['kv_cache_per_image']:.2f} GB per image (with CFG)",
             f"- one AR step (half-full cache): {m['ms_ar_step']:.2f} ms",
             f"- one {m['tokens']}-token verification forward: {m['ms_verify_all']:.1f} ms "
             f"({m['ms_verify_all'] / m['ms_ar_step']:.1f} AR steps)"]
    if "s_ar" not in m:
        return "\n".join(lines) + "\n"
    lines += [f"- plain AR, one image: {m['s_ar']:.2f} s", "",
              "| forced acceptance | MuLo-SD s | speed-up vs AR | sequential steps | verifier forwards | resampled |",
              "|---|---|---|---|---|---|"]
    for rate, r in m["mulosd"].items():
        lines.append(f"| {float(rate):.0%} | {r['s']:.2f} | {r['speedup']:.2f}x | {r['steps']} | "
                     f"{r['verifier_forwards']} | {r['resampled']}/{r['drafted']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="xl")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--rates", default=",".join(map(str, RATES)),
                    help="forced acceptance rates of the MuLo-SD decodes, comma-separated; '' = steps and memory only")
    ap.add_argument("--cfg-scale", type=float, default=None, help="default: the backbone's (7.5 LlamaGen, 4 Tar)")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    rates = tuple(float(x) for x in args.rates.split(",") if x.strip())
    cfg_scale = args.cfg_scale or (4.0 if SIZES[args.size]["kind"] == "tar" else 7.5)
    m = measure(args.size, args.device, getattr(torch, args.dtype), rates, cfg_scale)
    text = table(m)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(m, indent=2) + "\n")
        out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
