"""The GPU cost model of MuLo-SD on LlamaGen-XL shapes, without weights.

Randomly initialised GPT-XL verifier (512 px, 32x32 tokens) and drafter (256 px, 16x16), 120 caption slots,
16384 codes, in bf16; random latent samplers on a random normalised codebook. Measured at batch 1 with CFG:
- one AR step (one token against a half-full KV cache);
- one 1024-token verification forward (the whole image at once);
- decoding one image with `ar` and with `mulosd` (r = 2) at forced acceptance rates: the acceptance test is
  replaced by a coin per drafted token (rate 1.0, 0.97, 0.9), so rejection islands fall at random. The
  speed-up at a rate is what the loop's structure allows when the verifier accepts that share of the draft.

    python -m mulosd.llamagen.costmodel --device cuda --out docs/gpu_cost   # -> .json + .md
    python -m mulosd.llamagen.costmodel --size tiny                          # the harness itself, on CPU

Random weights make the verifier's distribution flat, so sampled tokens and resampling lengths differ from a
trained model's; latencies and the loop's step structure do not depend on the weights.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from ..ar import ARBackbone, Transformer, Warpers
from ..decoding import MuLoSDConfig, decode_ar, decode_mulosd
from ..samplers import LatentDownsampler, LatentUpsampler
from .gpt import CAPTION_DIM, CAPTION_SLOTS, VOCAB, gpt_config

# grid: the verifier's tokens per side (the drafter's is half); "tiny" exercises the harness in the test suite
SIZES = {"xl": dict(size="GPT-XL", grid=32, vocab=VOCAB, slots=CAPTION_SLOTS, caption=CAPTION_DIM, width=256, depth=4),
         "tiny": dict(size=(1, 2, 64), grid=8, vocab=512, slots=8, caption=32, width=16, depth=1)}
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
    make = lambda grid: Transformer(gpt_config(s["size"], grid, vocab_size=s["vocab"], prefix=s["slots"],  # noqa: E731
                                               caption_dim=s["caption"])).to(dev, dtype).eval()
    G, N = s["grid"], s["grid"] ** 2
    verifier, drafter = make(G), make(G // 2)
    captions = RandomCaptions(s["slots"], s["caption"], dev)
    codebook = torch.nn.functional.normalize(torch.randn(s["vocab"], 8), dim=-1)
    up = LatentUpsampler(codebook, 2, s["width"], s["depth"], head="latent").to(dev).eval()
    down = LatentDownsampler(codebook, 2, s["width"], s["depth"]).to(dev).eval()
    neighbours = torch.zeros(s["vocab"], 1, dtype=torch.long, device=dev)  # unused: acceptance is forced
    warpers = Warpers(1.0, 1000, 1.0)
    bb = lambda m: ARBackbone(m, captions, cfg_scale)  # noqa: E731
    prompt = ["a photo"]
    host = platform.processor() or platform.machine()
    out = {"size": size, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({host})",
           "dtype": str(dtype).removeprefix("torch."), "batch": 1, "cfg_scale": cfg_scale, "tokens": N,
           "params_verifier_M": sum(p.numel() for p in verifier.parameters()) / 1e6}
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
        ar_s = _timed(lambda: decode_ar(bb(verifier), prompt, warpers=warpers), dev, repeats=1)
        out["s_ar"] = ar_s
        out["mulosd"] = {}
        for rate in rates:
            traces = []

            def run(rate=rate, traces=traces):
                traces.append(decode_mulosd(bb(verifier), bb(drafter), up.up, down.down, prompt, neighbours,
                                            MuLoSDConfig(radius=1), warpers=warpers, accept=forced(rate))[1])

            sec = _timed(run, dev, repeats=1)
            t = traces[-1]
            out["mulosd"][str(rate)] = {"s": sec, "speedup": ar_s / sec, "steps": t.steps,
                                        "verifier_forwards": t.forwards["verifier"],
                                        "resampled": t.counts["resampled"], "drafted": t.counts["drafted"]}
    return out


def table(m: dict) -> str:
    shape = "LlamaGen-XL-shaped" if m["size"] == "xl" else f"{m['size']}"
    G = round(m["tokens"] ** 0.5)
    lines = [f"{shape} random models (r = 2, {G // 2}x{G // 2} -> {G}x{G} tokens) on {m['device']}, {m['dtype']}, "
             f"batch {m['batch']}, CFG {m['cfg_scale']} (verifier {m['params_verifier_M']:.0f}M parameters)", "",
             f"- one AR step (half-full cache): {m['ms_ar_step']:.2f} ms",
             f"- one {m['tokens']}-token verification forward: {m['ms_verify_all']:.1f} ms "
             f"({m['ms_verify_all'] / m['ms_ar_step']:.1f} AR steps)",
             f"- plain AR, one image: {m['s_ar']:.2f} s", "",
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
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    m = measure(args.size, args.device, getattr(torch, args.dtype))
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
