"""python -m mulosd.reports.rejudge RUN_DIR [--out REPORT.md]

A finished bench run judged again with today's judge: the run keeps every method's images
(RUN_DIR/images/<method>/NNNN.png) and the verdicts it was summarised with (RUN_DIR/verdicts.json), so a
change of the judge is measured on the very images, without decoding anything. Prints, per method, GenEval and
the paired difference against `ar` (95%) by the stored verdicts and by today's judge, and how many verdicts
changed; the last line `rejudge: RUN methods=.. changed=..`. The run's own files are left as they are."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from ..eval.geneval import category_rates, geneval_score, paired_difference
from . import publish


def rejudge(run: Path) -> list[dict]:
    """Per method of the run: its stored and today's verdicts, GenEval and difference against `ar`."""
    stored = json.loads((run / "verdicts.json").read_text())
    prompts, categories = stored["prompts"], stored["categories"]
    rows = []
    for method, before in tqdm(stored["passed"].items(), desc="rejudge", unit="method"):
        images = [np.asarray(Image.open(run / "images" / method / f"{i:04d}.png").convert("RGB"))
                  for i in range(len(prompts))]
        rows.append({"method": method, "before": before, "after": geneval_score(images, prompts)["passed"]})
    ar = rows[0]  # the bench summarises `ar` first
    for row in rows:
        for when in ("before", "after"):
            diff, se = paired_difference(row[when], ar[when], categories)
            row[f"geneval_{when}"] = category_rates(row[when], categories)["geneval"]
            row[f"vs_ar_{when}"] = (diff, 1.96 * se)
        row["changed"] = sum(a != b for a, b in zip(row["before"], row["after"], strict=True))
    return rows


def report(run: Path, rows: list[dict]) -> tuple[str, str]:
    n = len(rows[0]["before"])
    lines = [f"`python -m mulosd.reports.rejudge {run}`: {n} prompts, the run's stored verdicts against today's "
             "judge on the same images", "",
             "| method | GenEval (stored) | GenEval (today) | - ar (stored) | - ar (today) | verdicts changed |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['geneval_before']:.3f} | {r['geneval_after']:.3f} | "
                     f"{r['vs_ar_before'][0]:+.3f} ± {r['vs_ar_before'][1]:.3f} | "
                     f"{r['vs_ar_after'][0]:+.3f} ± {r['vs_ar_after'][1]:.3f} | "
                     f"{r['changed']} ({r['changed'] / n:.1%}) |")
    line = f"rejudge: {run.name} methods={len(rows)} changed={sum(r['changed'] for r in rows)}/{n * len(rows)}"
    return "\n".join(lines) + "\n", line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mulosd.reports.rejudge", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a bench run directory (its out_dir)")
    ap.add_argument("--out", type=Path, help="write the table (markdown) here")
    args = ap.parse_args(argv)
    if not (args.run / "verdicts.json").is_file() or not (args.run / "images").is_dir():
        print(f"error: {args.run} is not a finished bench run (no verdicts.json and images/ in it)", file=sys.stderr)
        return 2
    publish(*report(args.run, rejudge(args.run)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
