"""python -m mulosd.reports.acceptance [--n 200] [--batch 8] [--prompt-seed 4242] [--out docs/acceptance.md]

MuLo-SD's acceptance budget on the shipped zoo, at r = 2 (or at another size of a multi-resolution verifier,
`size=256 models.verifier=...`, with the samplers of that size, and at any r whose samplers the zoo holds there:
`r=4` at 256 px): where drafts are lost. The verifier's acceptance
test (its warped distribution pooled over `pool_k` codebook neighbours, then `acceptance=ratio` at `tau`: accepted
with probability min(1, mass / (tau q)), q the drafter's pooled mass of the parent low-res token; and the
paper's `threshold`, mass >= tau) is run on a ladder of drafts of the same prompts, each rung adding one source
of error to the one before:

  own            the verifier's own `ar` samples: the ceiling that its sharpness and the test allow
  img>U_r STAGE  its own image taken to the drafter's size (antialiased bicubic), VQ-encoded and up-sampled by U_r
                 (each loss stage the zoo holds for this r and size)
  img>SR         the same through the training-free pixel path (bicubic, Lanczos)
  D>U_r STAGE    its own tokens through D_r then U_r (how a later round's drafter context is made)
  drafter>U_r    the real drafter's drafts, drawn as decoding draws them (ZipAR window `draft_window`)
                 and serially, through U_r
  decoding       MuLo-SD at the shipped defaults (batch 1, as the bench times it): the share of drafts that
                 pass the test (raw) and the share kept after local rejection grows the rejections by `radius`

The rungs before `decoding` are tested teacher-forced: every position given the draft's own earlier tokens,
which is what a block's verification forward sees inside the block. Rates are expected acceptance (the ratio
test's probability averaged, not one draw), split by object vs background tokens (a token whose 8 x 8 patch
of the tested image holds object pixels by the judge's saturation rule) and by row within a drafted block.
The decoding rung also accounts every sequential step by phase (drafting, verification, resampling) and
re-grows its raw rejections at other radii (what the same drafts would keep: a bound, not a decode).

The ceiling: MuLo-SD decodes the first `--ceiling-n` prompts with the acceptance test replaced by a coin per
drafted token (forced rates, rejections falling at random), interleaved prompt by prompt with the peer it must
beat, ZipAR window 3, at batch 1 after a warm-up. Its speed against ZipAR at each rate, wall-clock and counting
only the backbones' forwards (no U_r, D_r, sampling or Python), says which acceptance the target of 1.2x needs;
the ladder says which acceptance the models give.

The last lines: `acceptance: own=.. up_token_ce=.. up_gan=.. lanczos=.. drafter=.. kept=..` (each `up_` entry only
where that stage ships at this r and size) and
`ceiling: ..`.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from skimage import color as skcolor
from tqdm import tqdm

from ..ar import ARBackbone, Warpers, warp
from ..choices import SAMPLER_STAGES
from ..config.infer import InferConfig
from ..data.images import downsample, to_tensor
from ..data.synthscenes.judge import OBJECT_MIN_SATURATION, OBJECT_MIN_VALUE
from ..decoding import from_config
from ..decoding.acceptance import pooled_mass
from ..decoding.ar import decode_ar
from ..decoding.islands import expand, raster_linked_islands
from ..decoding.mulosd import PHASES, MuLoSDConfig, decode_mulosd, draft_warpers, parents
from ..decoding.zipar import decode_zipar
from ..eval import EVAL_SEED, prompt_set
from ..pipeline import Pipeline
from ..samplers import PixelUpsampler
from ..tokenizer import tokens_to_images
from ..zoo import in_zoo, load_sampler, read_config, sampler_name
from . import publish
from .costmodel import forced

TAUS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
RADII = (0, 1, 2)
FORCED = (0.7, 0.84, 0.9, 0.95, 0.98, 1.0)  # about real decoding's raw rate, and the best up-sampler's (the ladder)
PEER_WINDOW = 3  # the fastest peer setting within 0.02 GenEval of `ar` on the bench (docs/log.md)
TARGET = 1.2  # the bar: MuLo-SD at least this much faster than that peer


@torch.no_grad()
def teacher_forced(bb: ARBackbone, captions: list[str], tokens: torch.Tensor, warpers: Warpers) -> torch.Tensor:
    """The warped distribution at every position given the tokens before it: tokens [B, N] -> logp [B, N, V]."""
    first = bb.start(captions)
    pos = torch.arange(tokens.shape[1] - 1, device=tokens.device).expand(len(captions), -1)
    return warp(torch.cat([first, bb(pos, tokens[:, :-1])], 1), warpers)


def object_tokens(images: list[np.ndarray], grid: int) -> torch.Tensor:
    """[B, grid*grid] bool: tokens whose patch holds an object pixel (the judge's saturation and value rule)."""
    out = []
    for im in images:
        hsv = skcolor.rgb2hsv(im)
        obj = (hsv[..., 1] >= OBJECT_MIN_SATURATION) & (hsv[..., 2] >= OBJECT_MIN_VALUE)
        p = obj.shape[0] // grid
        out.append(torch.from_numpy(obj.reshape(grid, p, grid, p).any(axis=(1, 3)).reshape(-1)))
    return torch.stack(out)


class Rung:
    """One rung of the ladder: per tested position the verifier's pooled mass, the drafter's q of its parent,
    and whether it is an object token; rates under any test are read off these."""

    def __init__(self, name: str):
        self.name, self.mass, self.q, self.obj = name, [], [], []

    def add(self, mass: torch.Tensor, q: torch.Tensor, obj: torch.Tensor) -> None:
        self.mass.append(mass.float().cpu())
        self.q.append(q.float().cpu())
        self.obj.append(obj.cpu())

    def done(self) -> Rung:
        self.mass, self.q, self.obj = (torch.cat(x) for x in (self.mass, self.q, self.obj))
        return self

    def passed(self, tau: float, test: str = "ratio") -> torch.Tensor:
        """[images, N] expected acceptance under `test` (threshold, sampled or ratio)."""
        if test == "threshold":
            return (self.mass >= tau).float()
        scale = tau * self.q if test == "ratio" else torch.full_like(self.q, tau)  # sampled: a drafter sure of it
        return (self.mass / scale.clamp_min(1e-12)).clamp(max=1.0)


class Timed:
    """A backbone whose forwards (the prefix's and every later one) add their wall-clock to `seconds`."""

    def __init__(self, backbone: ARBackbone):
        self.backbone, self.seconds = backbone, 0.0

    def __getattr__(self, name):
        return getattr(self.backbone, name)

    def _timed(self, fn, *args, **kw):
        t = time.perf_counter()
        out = fn(*args, **kw)
        self.seconds += time.perf_counter() - t
        return out

    def start(self, captions: list[str]) -> torch.Tensor:
        return self._timed(self.backbone.start, captions)

    def __call__(self, *args, **kw) -> torch.Tensor:
        return self._timed(self.backbone, *args, **kw)


def row_in_block(N: int, grid: int, block_rows: int) -> torch.Tensor:
    return (torch.arange(N) // grid) % block_rows


class Budget:
    """The models and the prompts' shared results (the verifier's own samples, their images)."""

    def __init__(self, cfg, prompt_seed: int, n: int, batch: int):
        self.cfg, self.prompt_seed, self.prompts, self.batch = cfg, prompt_seed, prompt_set(n, prompt_seed), batch
        self.pipe = Pipeline.from_config(cfg, {"mulosd"})
        self.knobs = from_config(MuLoSDConfig, cfg)
        p = self.pipe
        self.G, self.g = p.grid, p.drafter.net.cfg.grid
        self.r = self.G // self.g
        self.block_rows = self.r * self.knobs.rows_per_round(self.g)  # high-res rows of one drafted block
        self.parent = parents(self.G, self.g)
        self.draft_warpers = draft_warpers(p.warpers, self.knobs)
        self.drafter = p.backbone("drafter", cfg_scale=self.knobs.draft_cfg_scale)  # guided as decoding guides it
        self.size = cfg.size or read_config(cfg.models.verifier)["resolution"]  # the verifier's, in px
        # the ladder measures the stages the zoo holds at this r and size (the pipeline has refused a decoding
        # stage it lacks)
        self.stages = [s for s in SAMPLER_STAGES if in_zoo(sampler_name(self.r, s, self.size))]
        self.ups = {s: load_sampler(sampler_name(self.r, s, self.size), cfg.models.tokenizer)[0].up
                    for s in self.stages}
        self.ups |= {sr: PixelUpsampler(p.tokenizer, self.r, sr).up for sr in ("bicubic", "lanczos")}

    def chunks(self):
        for i in range(0, len(self.prompts), self.batch):
            yield self.prompts[i:i + self.batch], torch.arange(i, min(i + self.batch, len(self.prompts)))

    def mass(self, captions, high: torch.Tensor) -> torch.Tensor:
        logp = teacher_forced(self.pipe.backbone(), captions, high.flatten(1), self.pipe.warpers)
        return pooled_mass(logp, high.flatten(1), self.pipe.neighbours, self.knobs.pool_k)

    def q(self, captions, low: torch.Tensor) -> torch.Tensor:
        """The drafter's pooled mass of each low-res token given the ones before it, at every high-res child."""
        logq = teacher_forced(self.drafter, captions, low.flatten(1), self.draft_warpers)
        return pooled_mass(logq, low.flatten(1), self.pipe.neighbours, self.knobs.pool_k)[:, self.parent]

    def ladder(self) -> dict[str, Rung]:
        p, cfg, stage = self.pipe, self.cfg, self.cfg.stage
        rungs: dict[str, Rung] = {}  # in the order the tests list them
        for captions, ids in tqdm(list(self.chunks()), desc="acceptance ladder"):
            own, _ = decode_ar(p.backbone(), captions, seed=cfg.seed, warpers=p.warpers, image_ids=ids)
            images = tokens_to_images(p.tokenizer, own)
            img_low = p.tokenizer.encode(torch.stack([to_tensor(downsample(im, self.r)) for im in images]))
            d_low = p.down(own)
            drafts = {"": decode_zipar(self.drafter, captions, window=self.knobs.draft_window, seed=cfg.seed,
                                       warpers=self.draft_warpers, image_ids=ids)[0],
                      "serial ": decode_ar(self.drafter, captions, seed=cfg.seed, warpers=self.draft_warpers,
                                           image_ids=ids)[0]}
            tests = [("own", own, d_low)]
            tests += [(f"img>U_r {s}", self.ups[s](img_low), img_low) for s in self.stages]
            tests += [(f"img>{sr}", self.ups[sr](img_low), img_low) for sr in ("bicubic", "lanczos")]
            tests += [(f"D>U_r {s}", self.ups[s](d_low), d_low) for s in self.stages]
            tests += [(f"drafter>U_r {s}", self.ups[s](drafts[""]), drafts[""]) for s in self.stages]
            tests += [(f"serial drafter>U_r {stage}", self.ups[stage](drafts["serial "]), drafts["serial "])]
            qs = {}  # several rungs share a low-res grid: the drafter reads each once
            for name, high, low in tests:
                if id(low) not in qs:
                    qs[id(low)] = self.q(captions, low)
                shown = images if high is own else tokens_to_images(p.tokenizer, high)
                rungs.setdefault(name, Rung(name)).add(self.mass(captions, high), qs[id(low)],
                                                       object_tokens(shown, self.G))
        return {n: r.done() for n, r in rungs.items()}

    def decoding(self) -> dict:
        """MuLo-SD at the shipped defaults, batch 1: raw pass and kept per position, steps by phase, islands."""
        p, cfg, G = self.pipe, self.cfg, self.G
        block_rows = self.block_rows
        raw, kept, obj, drafted, steps, grown, islands = [], [], [], [], [], {rad: [] for rad in RADII}, []
        for i, caption in enumerate(tqdm(self.prompts, desc="mulosd decodes")):
            _, trace = p.decode("mulosd", cfg, [caption], torch.tensor([i]), rounds=True)
            steps.append([1] + [trace.counts[k] for k in PHASES] + [trace.steps])
            for rnd in trace.rounds:
                block = rnd.drafted[0]
                rows = int(block.sum()) // G
                rej = rnd.rejected[0][block].view(1, rows, G)
                raw.append(~rnd.rejected[0][block])
                kept.append(rnd.accepted[0][block])
                drafted.append(block.nonzero().flatten())
                for rad in RADII:
                    grown[rad].append(~expand(rej, rad, self.knobs.rejection).flatten())
                shown = tokens_to_images(p.tokenizer, rnd.high_draft.view(1, G, G))
                obj.append(object_tokens(shown, G)[0][block])
                isl = raster_linked_islands(rnd.resampled[0][block].view(rows, G).numpy())
                islands.append((len(isl), max((len(set(np.asarray(x) // G)) for x in isl), default=0)))
        pos = torch.cat(drafted)
        return {"raw": torch.cat(raw).float(), "kept": torch.cat(kept).float(), "obj": torch.cat(obj),
                "row": row_in_block(G * G, G, block_rows)[pos], "grown": {r: torch.cat(v).float().mean().item()
                                                                        for r, v in grown.items()},
                "steps": np.array(steps, dtype=float), "islands": np.array(islands, dtype=float)}

    def ceiling(self, n: int) -> dict[str, dict[str, float]]:
        """ZipAR window 3, MuLo-SD with its own test, and MuLo-SD at each FORCED rate, interleaved prompt by prompt
        at batch 1 (the order rotates) after one warm-up decode each: per method the mean wall seconds, forward
        seconds, steps, resampling steps and kept share."""
        p, cfg, k = self.pipe, self.cfg, self.knobs

        def zipar(caption, i):
            bb = Timed(p.backbone())
            _, t = decode_zipar(bb, [caption], window=PEER_WINDOW, seed=cfg.seed, warpers=p.warpers,
                                image_ids=torch.tensor([i]))
            return t, bb.seconds

        def mulosd(rate):
            def run(caption, i):
                v, d = Timed(p.backbone()), Timed(p.backbone("drafter", cfg_scale=k.draft_cfg_scale))
                _, t = decode_mulosd(v, d, p.up, p.down, [caption], p.neighbours, k, seed=cfg.seed,
                                     warpers=p.warpers, image_ids=torch.tensor([i]),
                                     accept=None if rate is None else forced(rate, seed=i))
                return t, v.seconds + d.seconds
            return run

        methods = {f"zipar w{PEER_WINDOW}": zipar, "mulosd": mulosd(None)} | {f"forced {r:g}": mulosd(r)
                                                                              for r in FORCED}
        for run in methods.values():  # warm-up
            run(self.prompts[0], 0)
        rows = {name: [] for name in methods}
        names = list(methods)
        for i, caption in enumerate(tqdm(self.prompts[:n], desc="ceiling (timed)")):
            for name in names[i % len(names):] + names[:i % len(names)]:
                t, fwd = methods[name](caption, i)
                drafted = t.counts.get("drafted", 0)
                rows[name].append([t.wall_s, fwd, t.steps, t.counts.get("resample_steps", 0),
                                   t.counts.get("accepted", 0) / drafted if drafted else float("nan")])
        cols = ("wall_s", "forward_s", "steps", "resample_steps", "kept")
        return {name: dict(zip(cols, np.array(r).mean(0), strict=True)) for name, r in rows.items()}


def _rate(x: torch.Tensor) -> str:
    return f"{x.float().mean().item():.3f}" if x.numel() else "-"


def needed_rate(rates: list[float], speeds: list[float], target: float) -> float | None:
    """The forced rate at which the speed first reaches `target`, read off the measured points (linear between
    the last one below and the first one at or above it; the lowest rate if that one already does); None where
    no measured rate reaches it."""
    points = list(zip(rates, speeds, strict=True))
    for i, (r, s) in enumerate(points):
        if s >= target:
            if i == 0:
                return r
            r0, s0 = points[i - 1]
            return r0 + (r - r0) * (target - s0) / (s - s0)
    return None


def ceiling_section(ceil: dict[str, dict[str, float]], n: int, up_rate: float, threads: int) -> tuple[list[str], str]:
    """The ceiling table, what it says, and the `ceiling:` line."""
    peer = ceil[f"zipar w{PEER_WINDOW}"]
    rows = ["## The ceiling: MuLo-SD's speed at a forced acceptance rate", "",
            f"{n} prompts, batch 1, {threads} thread{'s' * (threads != 1)}, one interleaved run after a warm-up: "
            f"ZipAR window {PEER_WINDOW} (the fastest peer setting within 0.02 GenEval of `ar`), MuLo-SD with its "
            "own test, and MuLo-SD with the test replaced by a coin per drafted token (re-tests too), rejections "
            "falling at random. `forwards only` counts the backbones' forwards alone, on both sides (MuLo-SD "
            "without U_r, D_r, sampling and the loop's Python: what a perfect implementation of this loop could "
            "reach with these models).", "",
            "| decode | steps | resampling steps | kept | ms per image | speed vs ZipAR | forwards only |",
            "|---|---|---|---|---|---|---|"]
    for name, m in ceil.items():
        kept = "" if np.isnan(m["kept"]) else f"{m['kept']:.3f}"
        rows.append(f"| {name} | {m['steps']:.1f} | {m['resample_steps']:.1f} | {kept} | {1e3 * m['wall_s']:.0f} | "
                    f"{peer['wall_s'] / m['wall_s']:.2f}x | {peer['forward_s'] / m['forward_s']:.2f}x |")
    forced_rows = [(float(name.split()[1]), m) for name, m in ceil.items() if name.startswith("forced")]
    rates = [r for r, _ in forced_rows]
    wall = needed_rate(rates, [peer["wall_s"] / m["wall_s"] for _, m in forced_rows], TARGET)
    fwd = needed_rate(rates, [peer["forward_s"] / m["forward_s"] for _, m in forced_rows], TARGET)
    fmt = lambda x: "above 1.0 (not reached)" if x is None else f"{x:.2f}"  # noqa: E731
    rows += ["", f"{TARGET:g}x ZipAR window {PEER_WINDOW} needs the verifier to accept {fmt(wall)} of the drafts "
             f"({fmt(fwd)} counting forwards only). The verifier's own image through the best up-sampler of the "
             f"ladder passes {up_rate:.3f}: that is what a drafter drawing exactly the verifier's image at its size "
             "would get."]
    line = (f"ceiling: {TARGET:g}x zipar_w{PEER_WINDOW} needs accept>={fmt(wall)} (forwards only {fmt(fwd)}); "
            f"best img>up={up_rate:.3f}")
    return rows, line


def report(budget: Budget, rungs: dict[str, Rung], dec: dict, ceil: dict, ceil_n: int, seconds: float,
           command: str) -> tuple[str, str]:
    cfg, k = budget.cfg, budget.knobs
    G, block_rows = budget.G, budget.block_rows
    rows = row_in_block(G * G, G, block_rows)
    n, threads = len(budget.prompts), torch.get_num_threads()
    low = f"{budget.size // budget.r} px"
    head = [f"# MuLo-SD's acceptance budget (r = {budget.r}, {budget.size} px verifier, {low} drafter)", "",
            f"Generated by `{command}` on {date.today().isoformat()} ({platform.machine()}, "
            f"{threads} thread{'s' * (threads != 1)}, {seconds / 60:.0f} min): {n} prompts of world seed "
            f"{budget.prompt_seed}, seed {cfg.seed}, the shipped models and defaults (acceptance={k.acceptance}, "
            f"tau={k.tau:g}, pool_k={k.pool_k}, radius={k.radius}, expanded={k.expanded}, "
            f"draft_rows={block_rows // budget.r}, draft={k.draft} window {k.draft_window}, "
            f"resample={k.resample} window {k.resample_window}, "
            f"up-sampler stage {cfg.stage}).", "",
            "Rates are expected acceptance per drafted high-res token (ratio test: its probability; threshold: "
            "mass >= tau). `obj` / `bg`: tokens whose patch holds object pixels of the tested image, or not (share of "
            "object tokens in brackets). `row i`: the token's row within a drafted block of "
            f"{block_rows} high-res rows.", "",
            "## The ladder at the default test", "",
            "| rung | default | threshold | obj | bg | " + " | ".join(f"row {i}" for i in range(block_rows)) + " |",
            "|---|---|---|---|---|" + "---|" * block_rows]
    for name, rung in rungs.items():
        acc = rung.passed(k.tau, k.acceptance)
        cells = [_rate(acc), _rate(rung.passed(k.tau, "threshold")),
                 f"{_rate(acc[rung.obj])} ({rung.obj.float().mean().item():.2f})", _rate(acc[~rung.obj])]
        cells += [_rate(acc[:, rows == i]) for i in range(block_rows)]
        head.append(f"| {name} | " + " | ".join(cells) + " |")
    raw, kept, obj, row = dec["raw"], dec["kept"], dec["obj"], dec["row"]
    for name, x in (("decoding: raw pass", raw), ("decoding: kept", kept)):
        cells = ["", f"{_rate(x[obj])} ({obj.float().mean().item():.2f})", _rate(x[~obj])]
        cells += [_rate(x[row == i]) for i in range(block_rows)]
        head.append(f"| {name} | {_rate(x)} | " + " | ".join(cells) + " |")
    head += ["", "## Over tau", "", "ratio test (the shipped `acceptance`), then the paper's threshold:", "",
             "| rung | " + " | ".join(f"ratio {t:g}" for t in TAUS) + " | "
             + " | ".join(f"thr {t:g}" for t in TAUS) + " |", "|---|" + "---|" * (2 * len(TAUS))]
    for name, rung in rungs.items():
        head.append(f"| {name} | " + " | ".join(_rate(rung.passed(t)) for t in TAUS) + " | "
                    + " | ".join(_rate(rung.passed(t, "threshold")) for t in TAUS) + " |")
    s, isl = dec["steps"], dec["islands"]
    head += ["", "## The rejection stage and the critical path (decoding, batch 1)", "",
             "Kept share if the same raw rejections were grown by another radius under the paper's rule (a "
             "decode at that radius resamples in other contexts; `expanded=reverify` keeps more): "
             + ", ".join(f"radius {r}: {v:.3f}" for r, v in dec["grown"].items())
             + f". Islands resampled per round: {isl[:, 0].mean():.1f} (mean), rows spanned by the tallest: "
             f"{isl[:, 1].mean():.1f} of {block_rows}.", "",
             "| | prefix | drafting | verification | resampling | total |", "|---|---|---|---|---|---|",
             "| sequential steps, mean | " + " | ".join(f"{v:.1f}" for v in s.mean(0)) + " |",
             "| min - max | " + " | ".join(f"{lo:.0f} - {hi:.0f}" for lo, hi in zip(s.min(0), s.max(0),
                                                                                    strict=True)) + " |"]
    rates = {name: rung.passed(k.tau, k.acceptance).mean().item() for name, rung in rungs.items()}
    own = rates["own"]
    up = {s: rates[f"img>U_r {s}"] for s in budget.stages}
    lanczos, drafter = rates["img>lanczos"], rates[f"drafter>U_r {cfg.stage}"]
    line = (f"acceptance: own={own:.3f} " + "".join(f"up_{s}={up[s]:.3f} " for s in ("token_ce", "gan") if s in up)
            + f"lanczos={lanczos:.3f} drafter={drafter:.3f} raw={raw.mean().item():.3f} kept={kept.mean().item():.3f}")
    head += ["", "## Where drafts are lost (default test, shares of all drafted tokens)", "",
             f"- the verifier's own sharpness and the test: {1 - own:.3f} (its own samples pass {own:.3f})",
             f"- the up-sampler ({cfg.stage} stage, from its own image at {low}): {own - up[cfg.stage]:.3f} "
             + (f"(token CE {own - up['token_ce']:.3f}, " if "token_ce" in up else "(")
             + f"Lanczos {own - lanczos:.3f})",
             f"- the drafter (its drafts against the verifier's own image at {low}, both through U_r): "
             f"{up[cfg.stage] - drafter:.3f}",
             f"- real decoding against the drafter rung (contexts: committed rows, D_r): "
             f"{drafter - raw.mean().item():.3f}",
             f"- the rejection stage (radius {k.radius}): {raw.mean().item() - kept.mean().item():.3f}", ""]
    best_up = max(v for name, v in rates.items() if name.startswith("img>"))  # any up-sampler, own image
    rows, ceiling_line = ceiling_section(ceil, ceil_n, best_up, threads)
    head += rows + ["", "```", line, ceiling_line, "```"]
    return "\n".join(head) + "\n", line + "\n" + ceiling_line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.acceptance", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8, help="batch of the ladder's decodes (decoding runs at 1)")
    ap.add_argument("--prompt-seed", type=int, default=EVAL_SEED)
    ap.add_argument("--ceiling-n", type=int, default=48, help="prompts of the timed ceiling run (its first ones)")
    ap.add_argument("--out", type=Path, help="write the report (markdown) here")
    ap.add_argument("overrides", nargs="*", help="infer.py settings, KEY=VALUE (default: what infer.py ships)")
    args = ap.parse_args(argv)
    if args.n < 1 or args.batch < 1 or args.ceiling_n < 1:
        ap.error("--n, --batch and --ceiling-n must be >= 1")
    from ..config import ConfigError
    from ..config.infer import validate_infer

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(InferConfig), OmegaConf.from_dotlist(args.overrides))
        validate_infer(cfg)
        if cfg.upsampler != "latent" or cfg.backbone != "synthscenes":
            raise ConfigError("upsampler", "the budget is defined for the shipped zoo with the latent up-sampler")
        for key in ("delta", "relative"):  # the ladder's rates read pooled mass against tau (and q) only
            if cfg[key]:
                raise ConfigError(key, "the budget's rates do not model it; leave it unset")
        start = time.perf_counter()
        budget = Budget(cfg, args.prompt_seed, args.n, args.batch)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rungs = budget.ladder()
    dec = budget.decoding()
    ceil_n = min(args.ceiling_n, args.n)
    ceil = budget.ceiling(ceil_n)
    command = " ".join(["python -m mulosd.reports.acceptance", f"--n {args.n}", f"--prompt-seed {args.prompt_seed}",
                        *args.overrides])
    publish(*report(budget, rungs, dec, ceil, ceil_n, time.perf_counter() - start, command), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
