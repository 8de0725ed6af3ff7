"""What `python bench.py` runs: every decoding strategy (MuLo-SD over a grid of r, tau, radius, ZipAR over its
windows: equal quality is read off both curves) on the same prompts and seeds, in one process, interleaved
batch by batch (A B C A B C ...: this CPU's timing drifts by +-25% between runs, so only ratios measured side
by side mean anything). Writes a markdown table, a CSV and plots of speed-up against SynthScenes-GenEval and
against FD-VGG, one curve per method.

Finished (point, batch) cells are appended to RUN/cells.jsonl with their images saved and the judge's verdicts,
so a killed bench resumes where it stopped instead of starting over, and a run whose cells.jsonl alone was kept
(a long run carried across machines) resumes and is summarised without the images of its earlier cells.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from tqdm import tqdm

from .atomic import atomic_write_bytes
from .config import ConfigError
from .config.bench import (
    Point,
    changes,
    common_changes,
    describe,
    grid,
    parse_cells,
    point_config,
    shard_of,
    validate_bench,
)
from .data.synthscenes.judge import VERSION as JUDGE_VERSION
from .decoding.registry import STRATEGIES
from .eval import categories, category_rates, geneval_score, paired_difference, prompt_set, reference_renders
from .machine import log_conditions, use_threads

log = logging.getLogger(__name__)

# every swept knob: a column of results.csv (blank where a point does not sweep it)
AXES = tuple(dict.fromkeys(a.key for s in STRATEGIES.values() for a in s.sweep))
# "equal quality": GenEval at most this far below `ar`'s (a method above `ar` is of equal quality too)
EQUAL_QUALITY = 0.02


def run(cfg: DictConfig, run_dir: Path) -> dict:
    from .pipeline import Pipeline

    validate_bench(cfg)
    out = Path(cfg.out_dir) if cfg.out_dir else run_dir
    out.mkdir(parents=True, exist_ok=True)
    prompts = prompt_set(cfg.n_prompts, seed=cfg.prompt_seed)
    use_threads(cfg.infer.threads)
    if cfg.mode == "throughput":
        return throughput(cfg, out, prompts)
    points = grid(cfg)
    log_conditions(log)
    cells_path = out / "cells.jsonl"
    done = {}
    with _locked(out):  # shards of one run read, mend and append to one cells.jsonl
        if cfg.resume and cells_path.is_file():
            done = _read_cells(cells_path)
            needed = {(p.name, s): len(prompts[s:s + cfg.batch_size]) for p in points
                      for s in range(0, len(prompts), cfg.batch_size)}
            names = {p.name for p in points}
            for key, cell in done.items():  # a cell of another batching would pair verdicts with the wrong prompts
                if key[0] in names and needed.get(key) != cell["n"]:
                    raise ConfigError("batch_size", f"{cells_path} holds cells of another batch size ({key[0]}: "
                                                    f"{cell['n']} prompts from {key[1]}); resume with that "
                                                    "batch_size, or give a new out_dir")
            done = _judged(done, cells_path, prompts, needed)
        elif cells_path.exists():
            cells_path.unlink()
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    pipes: dict = {}  # what they depend on -> Pipeline
    starts = range(0, len(prompts), cfg.batch_size)
    share, shards = shard_of(cfg.shard)
    mine = [s for s in starts if s // cfg.batch_size % shards == share]
    todo = [(s, p) for s in mine for p in points if (p.name, s) not in done]
    warmup = {}  # point -> seconds of its untimed first decode (allocation; compilation with compile=true)
    where = hardware(cfg.infer)  # stored with each cell: a resumed or re-summarised run may run elsewhere
    log.info(mulosd_settings(cfg, points))
    log.info(f"bench: {len(points)} points x {len(mine)} batches of {cfg.batch_size}"
             + (f" (shard {cfg.shard}: one batch in {shards} of the run's {len(starts)})" if shards > 1 else "")
             + f" = {len(todo)} decodes to run ({len(mine) * len(points) - len(todo)} done); the time left is "
             "estimated once every point still to run has decoded a batch")
    # points differ several-fold in cost, and a resumed run may owe some points more batches than others: the
    # estimate sums each remaining cell's own point's pace (decode, judge and images, warm-up left out)
    took: dict[str, list[float]] = {}
    estimated = False
    with tqdm(total=len(mine) * len(points), initial=len(mine) * len(points) - len(todo), desc="bench",
              unit="cell") as bar:
        for i, (start, point) in enumerate(todo):
            icfg = point_config(cfg, point)
            # what a pipeline loads depends on r and on these (a variant may change them)
            key = (icfg.r, icfg.backbone, icfg.upsampler, icfg.stage, icfg.sr, OmegaConf.to_yaml(icfg.models))
            if key not in pipes:
                pipes[key] = Pipeline.from_config(icfg, {"ar", *cfg.strategies})
            chunk = prompts[start:start + cfg.batch_size]
            ids = torch.arange(start, start + len(chunk))
            if point.name not in warmup:  # the first decode of a point in this process is not timed
                t = time.perf_counter()
                for n in _batch_sizes(len(prompts), cfg.batch_size):  # a shorter last batch has shapes of its own
                    pipes[key].precompile(point.strategy, icfg, prompts[:n])
                # eager, one image warms the code path up (a run resumed on a busy machine would otherwise decode
                # a whole batch twice per point); a compiled graph warms up at the shapes it will be timed at
                n = len(chunk) if icfg.compile else 1
                pipes[key].decode(point.strategy, icfg, chunk[:n], ids[:n])
                warmup[point.name] = time.perf_counter() - t
            began = time.perf_counter()
            tokens, trace = pipes[key].decode(point.strategy, icfg, chunk, ids)
            folder = out / "images" / point.name
            folder.mkdir(parents=True, exist_ok=True)
            images = pipes[key].images(tokens)
            for j, image in enumerate(images):
                Image.fromarray(image).save(folder / f"{start + j:04d}.png")
            cell = {"point": point.name, "start": start, "n": len(chunk), "wall_s": trace.wall_s,
                    "steps": trace.steps, "forwards": trace.forwards, "counts": trace.counts,
                    "counters": trace.counters(), "hardware": where,
                    "passed": geneval_score(images, chunk)["passed"], "judge": JUDGE_VERSION}
            with _locked(out), cells_path.open("a") as f:
                f.write(json.dumps(cell) + "\n")
            done[(point.name, start)] = cell
            bar.update(1)
            took.setdefault(point.name, []).append(time.perf_counter() - began)
            if not estimated and (rest := todo[i + 1:]) and all(p.name in took for _, p in rest):
                left = sum(statistics.mean(took[p.name]) for _, p in rest)
                log.info(f"bench: about {_duration(left)} to go ({len(rest)} decodes"
                         + (" of this shard" if shards > 1 else "") + " at each point's pace so far)")
                estimated = True
    if warmup:
        log.info("warm-up (untimed first decodes; compilation included): "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in warmup.items()))
    if shards > 1:  # the other shards' cells are in the file; the last shard to finish summarises
        with _locked(out):
            done = parse_cells(cells_path)[0]
        left = sum((p.name, s) not in done for s in starts for p in points)
        if left:
            log.info(f"bench: shard {cfg.shard} is done; {left} cells of the other shards are still to come, and "
                     "the last shard to finish writes the summary")
            return {"rows": [], "line": None}
    return summarise(cfg, out, prompts, points, done)


TODAY = "today's default"
NO_OTHER = "no other change"


def mulosd_settings(cfg: DictConfig, points: list[Point]) -> str:
    """The start-up line: which MuLo-SD settings will run, each as its knobs that differ from today's defaults
    (a change every point makes, such as the verifier, named once), and whether today's default is among them
    (named variants replace it: '+variants.default={}' adds it)."""
    ours = [p for p in points if STRATEGIES[p.strategy].variants and not p.compiled]
    if not ours:
        return "bench: no MuLo-SD point"
    each = {p.name: changes(cfg, p) for p in ours}
    everywhere = common_changes(list(each.values()))
    own = {name: describe(change, everywhere) for name, change in each.items()}  # "": today's default
    line = (f"bench: MuLo-SD runs at r={sorted({point_config(cfg, p).r for p in ours})}"
            + (f" (every point: {describe(everywhere)})" if everywhere else "") + ": "
            + ", ".join(f"{name} ({change or (NO_OTHER if everywhere else TODAY)})" for name, change in own.items()))
    if not everywhere and all(own.values()):
        line += f"; {TODAY} is not among them ('+variants.default={{}}' adds it)"
    return line


def _duration(seconds: float) -> str:
    """A time left as people read it: seconds, minutes or hours."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


@contextlib.contextmanager
def _locked(out: Path):
    """An exclusive lock on a run's folder, held while its cells.jsonl is read, mended or appended to."""
    with (out / "cells.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_cells(path: Path) -> dict:
    """A half-finished run's cells, keyed by (point, start). A cut-off last line (a run killed while writing it)
    is dropped from the file, so that its cell is measured again."""
    done, cut_off = parse_cells(path)
    if cut_off:
        log.warning(f"{path}: its last line is cut off; that cell is measured again")
        path.write_text("".join(f"{line}\n" for line in path.read_text().splitlines()[:-1]))
    return done


def _batch_sizes(n: int, batch: int) -> list[int]:
    """The batch sizes a pass over n prompts in batches of `batch` decodes: the full one, and a shorter last."""
    return sorted({min(batch, n), n % batch} - {0})


def throughput(cfg: DictConfig, out: Path, prompts: list[str]) -> dict:
    """mode=throughput: images per second of every point at each of `throughput_batches`, all prompts decoded
    in batches of that size, the points interleaved batch by batch after an untimed warm-up batch each. An
    image is the same alone and in a batch (every strategy keys its noise and acceptance per image), so the
    latency run's quality holds at every batch size; only time changes. That is checked, not assumed: each
    row's `differ` is the share of its tokens that differ from the same point's at the first batch size
    (batched float reductions may round differently at another width; a strategy that moved its images in
    lockstep would show here). The last line names the first MuLo-SD point's ratio to `ar` at each batch."""
    from .pipeline import Pipeline

    points = grid(cfg)
    pipes: dict = {}
    rows, first = [], {}
    for size in cfg.throughput_batches:
        seconds = dict.fromkeys((p.name for p in points), 0.0)
        tokens: dict[str, list] = {p.name: [] for p in points}
        starts = list(range(0, len(prompts), size))
        for start in [None, *starts]:  # None: the warm-up batch
            for point in points:
                icfg = point_config(cfg, point)
                icfg.batch_size = size
                key = (icfg.r, icfg.backbone, icfg.upsampler, icfg.stage, icfg.sr, OmegaConf.to_yaml(icfg.models))
                if key not in pipes:
                    pipes[key] = Pipeline.from_config(icfg, {"ar", *cfg.strategies})
                chunk = prompts[start or 0:(start or 0) + size]
                if start is None:
                    for n in _batch_sizes(len(prompts), size):
                        pipes[key].precompile(point.strategy, icfg, prompts[:n])
                got, trace = pipes[key].decode(point.strategy, icfg, chunk, torch.arange(len(chunk)) + (start or 0))
                if start is not None:
                    seconds[point.name] += trace.wall_s
                    tokens[point.name].append(got.cpu())
        ar = len(prompts) / seconds["ar"]
        for p in points:
            got = torch.cat(tokens[p.name])
            base = first.setdefault(p.name, got)
            rows.append({"method": p.name, "batch": size, "images_per_s": len(prompts) / seconds[p.name],
                         "vs_ar": len(prompts) / seconds[p.name] / ar, "differ": (got != base).double().mean().item()})
    lines = [f"{cfg.n_prompts} prompts (world seed {cfg.prompt_seed}), seed {cfg.seed}; {hardware(cfg.infer)}; "
             "images/s over all prompts, points interleaved batch by batch; the last column: the share of tokens "
             f"that differ from the same point's at batch {cfg.throughput_batches[0]}", "",
             "| method | " + " | ".join(f"batch {b}: images/s (vs ar)" for b in cfg.throughput_batches)
             + " | tokens that differ |",
             "|---|" + "---|" * len(cfg.throughput_batches) + "---|"]
    for p in points:
        cells = [r for r in rows if r["method"] == p.name]
        lines.append(f"| {p.name} | " + " | ".join(f"{r['images_per_s']:.2f} ({r['vs_ar']:.2f}x)" for r in cells)
                     + f" | {max(r['differ'] for r in cells):.2%} |")
    with (out / "throughput.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "throughput.md").write_text("\n".join(lines) + "\n")
    log.info("\n".join(lines))
    ours = next((p.name for p in points if p.strategy == "mulosd"), None)
    if ours is None:
        log.info("throughput: no mulosd point")
    else:
        mine = [r for r in rows if r["method"] == ours]
        ratios = " ".join(f"batch{r['batch']}={r['vs_ar']:.2f}x" for r in mine)
        log.info(f"throughput: {ours} {ratios} differ={max(r['differ'] for r in mine):.4f}")
    return {"rows": rows}


def summarise(cfg: DictConfig, out: Path, prompts: list[str], points: list[Point], done: dict) -> dict:
    from .eval.real_metrics import real_metrics
    from .zoo import read_config, world_radius

    reference = None
    if cfg.fd or cfg.metrics:  # the prompts drawn in the verifier's own world
        radius = world_radius(read_config(cfg.infer.models.verifier))
        reference = reference_renders(prompts, 128, cfg.seed, radius=radius)
    if cfg.fd:
        from .eval.fd import frechet_distance, vgg_features

        reference_features = vgg_features(reference)  # once, not once per point
    rows, reported, timed_on = [], set(), set()
    kinds = categories(prompts)
    for p in tqdm(points, desc="judge" + (" + FD-VGG" if cfg.fd else ""), unit="method"):
        cells = [done[(p.name, s)] for s in range(0, len(prompts), cfg.batch_size)]
        timed_on |= {c.get("hardware", "hardware not recorded") for c in cells}
        images = [_image(out / "images" / p.name, i) for i in range(len(prompts))] if cfg.fd or cfg.metrics else None
        passed = [v for c in cells for v in c["passed"]]
        score = {"passed": passed, "categories": kinds, **category_rates(passed, kinds)}
        row = {"method": p.name, "strategy": p.strategy, **{key: dict(p.settings).get(key, "") for key in AXES},
               "variant": p.variant or "", "compiled": p.compiled,
               "wall_s": sum(c["wall_s"] for c in cells),
               "steps": sum(c["steps"] for c in cells) / len(cells),
               "ms_per_step": 1e3 * sum(c["wall_s"] for c in cells) / sum(c["steps"] for c in cells),
               # hardware-independent, per image over the whole run; blank where a cell lacks them (written before
               # they existed, or resumed from the trimmed cells committed under docs/)
               **{f"{m}_forwards": _mean(cells, "forwards", m) for m in ("verifier", "drafter")},
               **{k: _mean(cells, "counters", k) for k in ("tokens_per_verifier_forward", "accepted_per_verification")},
               "geneval": score["geneval"], "passed": score["passed"], "categories": score["categories"]}
        if cfg.fd:
            row["fd_vgg"] = frechet_distance(vgg_features(images), reference_features)
        scores, skipped = real_metrics(cfg.metrics, images, prompts, reference, dict(cfg.metrics_weights))
        row |= scores
        for name, why in skipped.items():
            if name not in reported:
                log.info(f"metric {name} skipped: {why}")
                reported.add(name)
        rows.append(row)
    ar = rows[0]
    ar_passed = ar["passed"]
    # per-prompt verdicts, so that runs over other prompts or methods can be paired with this one
    (out / "verdicts.json").write_text(json.dumps({"prompts": prompts, "categories": ar["categories"],
                                                   "passed": {r["method"]: r["passed"] for r in rows}}))
    for row in rows:
        row["speedup"] = ar["wall_s"] / row["wall_s"]
        diff, se = paired_difference(row.pop("passed"), ar_passed, row.pop("categories"))
        row["geneval_vs_ar"], row["geneval_vs_ar_ci95"] = diff, 1.96 * se
    _write(out, rows, cfg, " and ".join(sorted(timed_on)))
    if cfg.compile and cfg.infer.backbone == "synthscenes":  # the released backbones' limits: reports/costmodel.py
        _step_table(out, rows, _verifier_shape(cfg))
    line = _last_line(rows, ar)
    log.info(line)
    return {"rows": rows, "line": line}


def _mean(cells: list[dict], group: str, key: str) -> float | str:
    """The mean over cells of cell[group][key] (0 where a group lacks the key: a model never called); "" unless
    every cell has the group."""
    if not all(group in c for c in cells):
        return ""
    return sum(c[group].get(key, 0) for c in cells) / len(cells)


def _image(folder: Path, i: int) -> np.ndarray:
    path = folder / f"{i:04d}.png"
    if not path.is_file():
        raise ConfigError("out_dir", f"{path} is missing: FD, the real metrics and verdicts of an older judge need "
                                     "the images (a run kept as its cells.jsonl alone has only its verdicts)")
    return np.asarray(Image.open(path))


def _judged(done: dict, path: Path, prompts: list[str], needed: dict) -> dict:
    """A resumed run's cells with today's judge's verdicts: a cell this run needs that was stored without them, or
    by an older judge, is judged again on its images and cells.jsonl rewritten (atomically), so that the file
    alone can summarise the run."""
    stale = [key for key, c in done.items() if key in needed and c.get("judge") != JUDGE_VERSION]
    if not stale:
        return done
    for point, start in tqdm(stale, desc=f"judging {len(stale)} cells by judge v{JUDGE_VERSION}", unit="cell"):
        cell = done[(point, start)]
        images = [_image(path.parent / "images" / point, i) for i in range(start, start + cell["n"])]
        cell |= {"passed": geneval_score(images, prompts[start:start + cell["n"]])["passed"],
                 "judge": JUDGE_VERSION}
    atomic_write_bytes(path, "".join(json.dumps(c) + "\n" for c in done.values()).encode())
    return done


def _verifier_shape(cfg: DictConfig):
    """The shipped-zoo verifier's TransformerConfig and its forward's rows (2 with guidance), for its roofline."""
    from .ar import TransformerConfig
    from .zoo import read_config

    meta = read_config(cfg.infer.models.verifier)
    scale = meta["sample"]["cfg_scale"] if cfg.infer.cfg_scale is None else cfg.infer.cfg_scale
    return TransformerConfig(**meta["config"]["transformer"]), 2 if scale != 1 else 1


def _step_table(out: Path, rows: list[dict], verifier) -> None:
    """compile=true: every method's ms per sequential step, eager and compiled, against the roofline of the
    verifier's one-token step on this machine (reports/roofline.py)."""
    from .reports.roofline import forward_cost, limit_ms, machine

    cfg, guided_rows = verifier
    m = machine()
    limit = limit_ms(*forward_cost(cfg, 1, guided_rows), m["flops"], m["bandwidth"])
    by = {r["method"]: r for r in rows}
    lines = [f"ms per sequential step (the decode loop: forward, sampling, bookkeeping) against the verifier's "
             f"one-token step limit {limit:.3f} ms ({m['flops'] / 1e9:.0f} GFLOP/s, {m['bandwidth'] / 1e9:.0f} GB/s "
             f"measured, {m['threads']} threads)", "",
             "| method | eager ms/step | compiled ms/step | eager / compiled | compiled / limit |",
             "|---|---|---|---|---|"]
    for name, r in by.items():
        if name.endswith("_compiled") or name + "_compiled" not in by:
            continue
        c = by[name + "_compiled"]
        lines.append(f"| {name} | {r['ms_per_step']:.3f} | {c['ms_per_step']:.3f} | "
                     f"{r['ms_per_step'] / c['ms_per_step']:.2f}x | {c['ms_per_step'] / limit:.1f}x |")
    (out / "steps.md").write_text("\n".join(lines) + "\n")
    log.info("\n".join(lines))


def hardware(icfg: DictConfig) -> str:
    """Where a measurement ran: the processor or GPU, threads, the models' dtype and library versions."""
    import platform

    import lightning

    dtype = {"llamagen_t2i": icfg.llamagen.dtype, "tar": icfg.tar.dtype}.get(icfg.backbone, "float32")
    if icfg.device == "cuda" and torch.cuda.is_available():
        where = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    else:
        where = f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    return (f"{where}, {dtype}, torch {torch.__version__}, lightning {lightning.__version__}, "
            f"python {platform.python_version()}")


def _write(out: Path, rows: list[dict], cfg: DictConfig, timed_on: str) -> None:
    keys = list(rows[0])
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    fd = "fd_vgg" in rows[0]
    lines = [f"{cfg.n_prompts} prompts (world seed {cfg.prompt_seed}), seed {cfg.seed}, batch {cfg.batch_size}; "
             f"timed on {timed_on}, `ar` at {rows[0]['ms_per_step']:.2f} ms per sequential step (a busy machine "
             f"shows here); speed-up = wall-clock of ar / of the method, same run; judge v{JUDGE_VERSION}", "",
             "| method | speed-up | sequential steps | verifier forwards | tokens per verifier forward | "
             "drafter forwards | GenEval | GenEval - ar (paired, 95% CI) |" + (" FD-VGG |" if fd else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if fd else "")]
    def number(x, digits: int) -> str:  # a blank counter stays blank
        return x if x == "" else f"{x:.{digits}f}"

    for r in rows:
        lines.append(f"| {r['method']} | {r['speedup']:.2f}x | {r['steps']:.0f} | "
                     f"{number(r['verifier_forwards'], 0)} | {number(r['tokens_per_verifier_forward'], 2)} | "
                     f"{number(r['drafter_forwards'], 0)} | {r['geneval']:.3f} | "
                     f"{r['geneval_vs_ar']:+.3f} ± {r['geneval_vs_ar_ci95']:.3f} |"
                     + (f" {r['fd_vgg']:.2f} |" if fd else ""))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    log.info("\n".join(lines))
    _plot(out, rows, fd)


def _plot(out: Path, rows: list[dict], fd: bool) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("plots skipped: matplotlib is not installed")
        return
    metrics = [("geneval", "SynthScenes-GenEval (higher is better)")] + ([("fd_vgg", "FD-VGG (lower is better)")]
                                                                        if fd else [])
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.5), squeeze=False)
    for ax, (key, label) in zip(axes[0], metrics, strict=True):
        curves: dict[str, list] = {}
        for r in rows:
            curve = (r["strategy"] if not STRATEGIES[r["strategy"]].variants else  # its points split by r and radius
                     r["strategy"] + "".join(f" {k}={r[k]}" for k in ("r", "radius") if r.get(k, "") != "")
                     + (f" {r['variant']}" if r["variant"] else ""))
            curves.setdefault(curve + " compiled" * r["compiled"], []).append(r)
        if key == "geneval":  # ar's level, and each point's paired 95% interval against ar around it
            ax.axhline(rows[0]["geneval"], color="grey", lw=0.8, ls="--")
            ax.set_title("dashed: ar; bars: 95% interval of the paired difference from ar", fontsize=8)
        for curve, rs in curves.items():
            rs = sorted(rs, key=lambda r: next((r[k] for k in ("tau", "window") if r[k] != ""), 0))
            line, = ax.plot([r["speedup"] for r in rs], [r[key] for r in rs], "o-" if len(rs) > 1 else "s",
                            label=curve)
            if key == "geneval":
                ax.errorbar([r["speedup"] for r in rs], [r[key] for r in rs], [r["geneval_vs_ar_ci95"] for r in rs],
                            fmt="none", ecolor=line.get_color(), alpha=0.5, capsize=2)
            for r in rs:
                if r["tau"] != "" or r["window"] != "":
                    text = f"τ={r['tau']:g}" if r["tau"] != "" else f"s={r['window']}"
                    ax.annotate(text, (r["speedup"], r[key]), fontsize=7)
        ax.set_xlabel("speed-up over ar (wall-clock)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)


def _last_line(rows: list[dict], ar: dict) -> str:
    """`bench: mulosd_r2 ... [mulosd_r4 ...] ar_geneval=... best_peer=... best_peer_speedup=...`: per ratio measured,
    MuLo-SD's fastest point within EQUAL_QUALITY of ar (its fastest at all where none is); the best peer is the
    fastest baseline within it."""
    near = [r for r in rows if r["geneval"] >= ar["geneval"] - EQUAL_QUALITY]
    ours = [r for r in rows if STRATEGIES[r["strategy"]].variants]  # the method under study
    peers = [r for r in near if r["strategy"] != "ar" and not STRATEGIES[r["strategy"]].variants]
    peer = max(peers, key=lambda r: r["speedup"]) if peers else None
    parts = []
    for ratio in sorted({r["r"] for r in ours}) or [2]:
        at = [r for r in ours if r["r"] == ratio]
        pick = max([r for r in at if r in near] or at, key=lambda r: r["speedup"]) if at else None
        parts.append(f"mulosd_r{ratio} " + (f"speedup={pick['speedup']:.2f} geneval={pick['geneval']:.3f}" if pick
                                             else "not measured"))
    return (f"bench: {' '.join(parts)} ar_geneval={ar['geneval']:.3f} "
            f"best_peer={peer['method'] if peer else 'none'} best_peer_speedup={peer['speedup'] if peer else 0:.2f}")
