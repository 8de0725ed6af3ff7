"""python -m mulosd.reports.frontier --speed RUN [RUN ...] --quality RUN [RUN ...] [--out DIR]

Speed against quality, every point with its interval: the speed-up over `ar` from a batch-1 bench run (each
cell one prompt, so the ratio's 95% interval is a bootstrap over prompts, resampled together for every
method), and GenEval against `ar` from a bench run over more prompts (the paired 95% interval of
eval.geneval). Both runs are read from their cells.jsonl and config.yaml alone, so runs carried between
machines without their images serve; the quality run may be unfinished (the table says over how many prompts,
the ones every point has). The prompts the two runs share must give the same verdicts: a batch decodes every
image as it decodes alone, and the report counts the ones that differ. Points measured later join as another
pair of runs (`--speed A B --quality A2 B2`): each pair times and judges its own `ar`, so a speed-up is always
a ratio within one interleaved run.

"Ahead" is claimed only beyond both intervals: A is ahead of B when the bootstrap interval of A's speed over
B's lies above 1 and the paired interval of A's GenEval minus B's lies above 0. A point keeps `ar`'s quality
when its interval against `ar` reaches 0. Writes DIR/frontier.md (the table), frontier.csv and frontier.png;
the last line `frontier: fastest_at_ar_quality=.. speedup=.. mulosd_best=.. best_peer=.. mulosd_over_peer=..
steps_mulosd_best=.. ..`: among the points that keep `ar`'s quality (`none` and 0.00 where none does), the
fastest by wall-clock on this machine, and MuLo-SD's fastest against the fastest peer's, by wall-clock and by
sequential forwards each counted as one (what a GPU at batch 1 would pay if every forward cost the same)."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from ..config.bench import HOW_RUN_KEYS, changes, common_changes, describe, grid, parse_cells, point_config
from ..data.synthscenes.judge import VERSION as JUDGE_VERSION
from ..eval import categories, category_rates, paired_difference, prompt_set
from . import publish

BOOTSTRAP = 2000  # resamples of the prompts for the speed-up's interval
Z95 = 1.96


def read_run(run: Path) -> tuple:
    """A bench run's config and its cells by point ({start: cell}); a cut-off last line (a run still going, or
    killed while writing) is left out."""
    for name in ("config.yaml", "cells.jsonl"):
        if not (run / name).is_file():
            raise FileNotFoundError(f"{run} is not a bench run: no {name} in it")
    cells: dict[str, dict[int, dict]] = {}
    for (point, start), cell in parse_cells(run / "cells.jsonl")[0].items():
        cells.setdefault(point, {})[start] = cell
    return OmegaConf.load(run / "config.yaml"), cells


def chain(cells: dict[int, dict]) -> list[dict]:
    """A point's cells from the first prompt on, each starting where the one before ended, up to the first gap."""
    out, n = [], 0
    while n in cells:
        out.append(cells[n])
        n += cells[n]["n"]
    return out


def covered(cells: dict[int, dict]) -> int:
    """How many prompts from the first on a point's cells cover without a gap."""
    return sum(c["n"] for c in chain(cells))


def verdicts(cells: dict[int, dict], n: int) -> list[bool]:
    """The verdicts of a point's first n prompts, by today's judge."""
    out = []
    for c in chain(cells):
        if c.get("judge") != JUDGE_VERSION:
            raise ValueError(f"cell {c['point']}@{c['start']} was not judged by judge v{JUDGE_VERSION}: resume its "
                             "run once with today's bench, which judges such cells again on their images")
        out += c["passed"]
    if len(out) < n:
        raise ValueError(f"{len(out)} verdicts where {n} are needed")
    return out[:n]


def speed(cells: dict[str, dict[int, dict]], n: int, rng: np.random.Generator) -> dict[str, dict]:
    """Per point of a batch-1 run: its speed-up over `ar`, the bootstrap 95% interval, mean sequential steps, and
    the per-prompt wall times (for pairwise intervals)."""
    walls = {p: np.array([cs[i]["wall_s"] for i in range(n)]) for p, cs in cells.items()}
    picks = rng.integers(0, n, size=(BOOTSTRAP, n))
    out = {}
    for p, w in walls.items():
        ratio = walls["ar"][picks].sum(1) / w[picks].sum(1)
        out[p] = {"speedup": walls["ar"].sum() / w.sum(), "ci": tuple(np.percentile(ratio, [2.5, 97.5])),
                  "steps": float(np.mean([cells[p][i]["steps"] for i in range(n)])), "wall": w}
    return out


def _same_images(a, b, what: str) -> None:
    """Two runs' configs must decode the same images: the same prompts and the same sampling noise."""
    for key in ("prompt_seed", "seed"):
        if a[key] != b[key]:
            raise ValueError(f"the {what} decode different images: {key} {a[key]} and {b[key]}")


def pair(speed_run: Path, quality_run: Path) -> tuple:
    """A speed run and the quality run of the same points: their configs, cells, and the points both measured
    with the same settings (`ar` first), in the speed run's order."""
    scfg, scells = read_run(speed_run)
    qcfg, qcells = read_run(quality_run)
    if scfg.batch_size != 1:
        raise ValueError(f"{speed_run}: the speed run must be at batch 1 (it is at {scfg.batch_size})")
    _same_images(scfg, qcfg, "runs")
    points = [p for p in grid(scfg) if p.name in qcells and p.name in scells]
    for p in points:  # the same name must mean the same settings in both runs
        ours, theirs = (OmegaConf.to_container(point_config(c, p)) for c in (scfg, qcfg))
        differ = sorted(k for k in ours.keys() | theirs.keys()
                        if k not in HOW_RUN_KEYS and ours.get(k) != theirs.get(k))
        if differ:
            raise ValueError(f"{p.name} decodes with other settings in {quality_run} than in {speed_run}: "
                             f"{', '.join(differ)}")
    if not points or points[0].name != "ar":
        raise ValueError(f"{speed_run} and {quality_run} share no measured `ar`, which every comparison is against")
    return scfg, qcfg, scells, qcells, points


def frontier(pairs: list[tuple[Path, Path]], seed: int = 0) -> dict:
    """The joined table: a row per point measured in both runs of a (speed run, quality run) pair, in the runs'
    order. Every pair measures its own `ar`, which its points' speed-ups and GenEval differences are against;
    the table's `ar` row is the first pair's. Points of different pairs are compared through their ratios to
    their own `ar` on the same resampled prompts."""
    joined = [pair(s, q) for s, q in pairs]
    for scfg, *_ in joined[1:]:
        _same_images(joined[0][0], scfg, "pairs")
    names = [p.name for i, (*_, points) in enumerate(joined) for p in points if not (i and p.name == "ar")]
    if len(set(names)) < len(names):
        raise ValueError(f"a point is measured by two pairs: {sorted({n for n in names if names.count(n) > 1})}")
    ns = min(covered(scells[p.name]) for _, _, scells, _, points in joined for p in points)
    nq = min(covered(qcells[p.name]) for _, _, _, qcells, points in joined for p in points)
    if not ns or not nq:
        raise ValueError(f"no prompt that every point has: {ns} in the speed runs, {nq} in the quality runs")
    world = joined[0][0].prompt_seed
    kinds = categories(prompt_set(max(ns, nq), seed=world))
    rng = np.random.default_rng(seed)
    shared = min(ns, nq)
    fast, passed, rows, ar_differ = {}, {}, [], 0
    # a change every point of every pair makes (the verifier, say) is named once, in the table's header
    each = [{p.name: changes(scfg, p) for p in points} for scfg, *_, points in joined]
    everywhere = common_changes([c for pair_changes in each for c in pair_changes.values()])
    for i, (_, _, scells, qcells, points) in enumerate(joined):
        timed = speed({p.name: scells[p.name] for p in points}, ns, rng)
        ar = verdicts(qcells["ar"], nq)
        if i:
            ar_differ += sum(a != b for a, b in zip(ar, passed["ar"], strict=True))
        for p in points:
            if i and p.name == "ar":
                continue
            fast[p.name] = timed[p.name] | {"ar_wall": timed["ar"]["wall"]}
            passed[p.name] = verdicts(qcells[p.name], nq)
            diff, se = paired_difference(passed[p.name], ar, kinds[:nq])
            differ = sum(a != b for a, b in
                         zip(verdicts(scells[p.name], shared), passed[p.name][:shared], strict=True))
            knobs = describe(each[i][p.name], everywhere) or "defaults"
            rows.append({"method": p.name, "strategy": p.strategy, "knobs": knobs,
                         "speedup": fast[p.name]["speedup"], "speedup_lo": fast[p.name]["ci"][0],
                         "speedup_hi": fast[p.name]["ci"][1], "steps": fast[p.name]["steps"],
                         "steps_speedup": timed["ar"]["steps"] / fast[p.name]["steps"],
                         "geneval": category_rates(passed[p.name], kinds[:nq])["geneval"],
                         "vs_ar": diff, "vs_ar_ci95": Z95 * se, "keeps_ar": diff + Z95 * se >= 0,
                         "verdicts_differ": differ})
    picks = rng.integers(0, ns, size=(BOOTSTRAP, ns))
    for a in rows:
        a["behind"] = [b["method"] for b in rows if b is not a and _ahead(b, a, fast, passed, kinds[:nq], picks)]
    return {"rows": rows, "n_speed": ns, "n_quality": nq, "n_quality_target": min(q.n_prompts for _, q, *_ in joined),
            "shared": shared, "everywhere": describe(everywhere), "world": world,
            "ar_differ": ar_differ if len(joined) > 1 else None,
            "timed_on": "; ".join(dict.fromkeys(_timed_on(scells) for _, _, scells, *_ in joined))}


def _ahead(a: dict, b: dict, fast: dict, passed: dict, categories: list[str], picks: np.ndarray) -> bool:
    """a is ahead of b beyond both intervals: faster (the bootstrap interval of a's speed-up over b's, each
    against its own run's `ar`, above 1) and better in GenEval (paired interval above 0)."""
    (wa, ara), (wb, arb) = ((fast[x["method"]]["wall"], fast[x["method"]]["ar_wall"]) for x in (a, b))
    ratio = (ara[picks].sum(1) / wa[picks].sum(1)) / (arb[picks].sum(1) / wb[picks].sum(1))
    if np.percentile(ratio, 2.5) <= 1:
        return False
    diff, se = paired_difference(passed[a["method"]], passed[b["method"]], categories)
    return diff - Z95 * se > 0


def _timed_on(cells: dict) -> str:
    where = sorted({c.get("hardware", "hardware not recorded") for cs in cells.values() for c in cs.values()})
    ar = cells["ar"].values()
    ms = 1e3 * sum(c["wall_s"] for c in ar) / sum(c["steps"] for c in ar)
    return f"{' and '.join(where)}; `ar` at {ms:.2f} ms per sequential step"


def headline(rows: list[dict]) -> str:
    """The fastest point that keeps `ar`'s quality, MuLo-SD's fastest that does, the fastest peer that does and
    MuLo-SD's speed-up over it: by wall-clock, then by sequential forwards each counted as one."""
    parts = []
    for measure, prefix in (("speedup", ""), ("steps_speedup", "steps_")):
        keep = sorted((r for r in rows if r["keeps_ar"] and r["strategy"] != "ar"), key=lambda r: -r[measure])
        ours = next((r for r in keep if r["strategy"] == "mulosd"), None)
        peer = next((r for r in keep if r["strategy"] != "mulosd"), None)
        over = ours[measure] / peer[measure] if ours and peer else 0.0
        if not prefix:
            parts += [f"fastest_at_ar_quality={keep[0]['method'] if keep else 'none'}",
                      f"speedup={keep[0][measure] if keep else 0:.2f}"]
        parts += [f"{prefix}mulosd_best={ours['method'] if ours else 'none'}",
                  f"{prefix}mulosd_speedup={ours[measure] if ours else 0:.2f}",
                  f"{prefix}best_peer={peer['method'] if peer else 'none'}",
                  f"{prefix}best_peer_speedup={peer[measure] if peer else 0:.2f}",
                  f"{prefix}mulosd_over_peer={over:.2f}"]
    return "frontier: " + " ".join(parts + [f"points={len(rows)}"])


def report(f: dict) -> tuple[str, str]:
    rows = f["rows"]
    runs = ("one interleaved run per pair of runs, each point against its own run's `ar`"
            if f["ar_differ"] is not None else "one interleaved run")
    lines = [f"World {f['world']}: speed-up over `ar` at batch 1 on {f['n_speed']} prompts ({runs}; "
             f"95% bootstrap interval over prompts), timed on {f['timed_on']}; GenEval on {f['n_quality']} prompts"
             + (f" of the run's {f['n_quality_target']} (unfinished)" if f["n_quality"] < f["n_quality_target"]
                else "")
             + f", paired against `ar` (95%). Verdicts that differ between the two runs on their {f['shared']} "
             f"shared prompts: {sum(r['verdicts_differ'] for r in rows)} of {f['shared'] * len(rows)}"
             + (f"; `ar`'s verdicts that differ between the quality runs: {f['ar_differ']}"
                if f["ar_differ"] is not None else "") + ". The last "
             f"column tests every pair ({len(rows) * (len(rows) - 1)} tests at 95% each, uncorrected): expect a "
             "claim or two by chance among many points."
             + (f" Every point decodes with {f['everywhere']}; the knobs column names the rest." if f["everywhere"]
                else ""), "",
             "| method | knobs | speed-up (95%) | steps (speed-up) | GenEval | - `ar` (paired, 95%) | "
             "keeps `ar`'s quality | "
             "behind (ahead of it beyond both intervals) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["speedup"]):
        lines.append(f"| {r['method']} | {r['knobs']} | {r['speedup']:.2f}x ({r['speedup_lo']:.2f}-"
                     f"{r['speedup_hi']:.2f}) | {r['steps']:.0f} ({r['steps_speedup']:.1f}x) | {r['geneval']:.3f} | "
                     f"{r['vs_ar']:+.3f} ± {r['vs_ar_ci95']:.3f} | {'yes' if r['keeps_ar'] else 'no'} | "
                     f"{', '.join(r['behind']) or '-'} |")
    line = headline(rows)
    return "\n".join(lines) + "\n", line


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        rs = [r for r in rows if r["strategy"] == strategy]
        x = np.array([r["speedup"] for r in rs])
        xerr = np.array([[r["speedup"] - r["speedup_lo"] for r in rs], [r["speedup_hi"] - r["speedup"] for r in rs]])
        ax.errorbar(x, [r["vs_ar"] for r in rs], yerr=[r["vs_ar_ci95"] for r in rs], xerr=xerr, fmt="o",
                    capsize=2, label=strategy, alpha=0.85)
        for r in rs:
            ax.annotate(r["method"].removeprefix(strategy).strip("_") or strategy, (r["speedup"], r["vs_ar"]),
                        fontsize=6, xytext=(3, 3), textcoords="offset points")
    best = []  # the frontier by point estimates: no point both faster and better
    for r in sorted(rows, key=lambda r: -r["speedup"]):
        if not best or r["vs_ar"] > best[-1]["vs_ar"]:
            best.append(r)
    ax.plot([r["speedup"] for r in best], [r["vs_ar"] for r in best], color="black", lw=0.8, alpha=0.5,
            label="frontier (point estimates)")
    ax.set_xlabel("speed-up over ar, batch 1 (95% bootstrap interval)")
    ax.set_ylabel("GenEval - ar (paired 95% interval)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.frontier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speed", type=Path, nargs="+", required=True,
                    help="bench runs at batch_size=1 (their out_dirs), each with its own `ar`")
    ap.add_argument("--quality", type=Path, nargs="+", required=True,
                    help="bench runs over more prompts of the same world, one per speed run, in the same order")
    ap.add_argument("--out", type=Path, help="write frontier.md, frontier.csv and frontier.png into this folder")
    args = ap.parse_args(argv)
    try:
        if len(args.speed) != len(args.quality):
            raise ValueError(f"{len(args.speed)} speed runs and {len(args.quality)} quality runs: give them in pairs")
        f = frontier(list(zip(args.speed, args.quality, strict=True)))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text, line = report(f)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        keys = [k for k in f["rows"][0] if k != "behind"]
        with (args.out / "frontier.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, keys + ["behind"])
            w.writeheader()
            w.writerows({**{k: r[k] for k in keys}, "behind": " ".join(r["behind"])} for r in f["rows"])
        plot(f["rows"], args.out / "frontier.png",
             f"world {f['world']}: speed on {f['n_speed']} prompts, GenEval on {f['n_quality']}")
    publish(text, line, args.out / "frontier.md" if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
