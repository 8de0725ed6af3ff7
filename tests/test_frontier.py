"""python -m mulosd.reports.frontier on two synthetic bench runs (cells.jsonl and config.yaml, no image): speed
from the batch-1 run with a bootstrap interval, GenEval from the longer run paired against ar, and "ahead" only
beyond both intervals."""

import csv
import json
import re

import numpy as np
import pytest
from omegaconf import OmegaConf

from mulosd.reports import frontier

from .conftest import compose_config

WORLD = 8128
N_SPEED, N_QUALITY = 40, 120


def _run(folder, n, batch, walls, passed, steps):
    """A bench run over zipar windows 1 and 3: each point's wall time per prompt and verdicts."""
    cfg = compose_config("bench", ["strategies=[zipar]", "windows=[1,3]", f"n_prompts={n}", f"batch_size={batch}",
                                   f"prompt_seed={WORLD}"])
    folder.mkdir()
    OmegaConf.save(cfg, folder / "config.yaml")
    with (folder / "cells.jsonl").open("w") as f:
        for start in range(0, n, batch):
            for point in walls:
                cell = {"point": point, "start": start, "n": batch, "steps": steps[point],
                        "wall_s": float(sum(walls[point][start:start + batch])),
                        "passed": passed[point][start:start + batch], "judge": 5}
                f.write(json.dumps(cell) + "\n")


@pytest.fixture
def runs(tmp_path):
    rng = np.random.default_rng(0)
    ar = [bool(v) for v in rng.random(N_QUALITY) < 0.4]
    better = [bool(a or rng.random() < 0.5) for a in ar]  # passes everything ar passes and half of the rest
    passed = {"ar": ar, "zipar_s1": [False] * N_QUALITY, "zipar_s3": better}
    steps = {"ar": 256, "zipar_s1": 31, "zipar_s3": 61}
    speed_passed = {k: list(v[:N_SPEED]) for k, v in passed.items()}
    speed_passed["zipar_s3"][0] = not speed_passed["zipar_s3"][0]  # a batch that changed one image
    walls = {k: (1.0 / s) * (1 + 0.1 * rng.standard_normal(N_SPEED)) for k, s in
             {"ar": 1.0, "zipar_s1": 4.0, "zipar_s3": 2.0}.items()}
    _run(tmp_path / "speed", N_SPEED, 1, walls, speed_passed, steps)
    _run(tmp_path / "quality", N_QUALITY, 8, {k: np.ones(N_QUALITY) for k in walls}, passed, steps)
    return tmp_path


def test_the_frontier_joins_speed_and_quality_with_their_intervals(runs, capsys):
    assert frontier.main(["--speed", str(runs / "speed"), "--quality", str(runs / "quality"),
                          "--out", str(runs / "out")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"frontier: fastest_at_ar_quality=zipar_s3 speedup=(\d\.\d\d) mulosd_best=none "
                        r"mulosd_speedup=0\.00 points=3", lines[-1])
    assert last and abs(float(last[1]) - 2) < 0.1, lines[-1]  # zipar_s3's walls are half of ar's, +-10% noise
    rows = {r["method"]: r for r in csv.DictReader((runs / "out" / "frontier.csv").open())}
    assert float(rows["zipar_s1"]["speedup_lo"]) < 4 < float(rows["zipar_s1"]["speedup_hi"]) < 4.4
    assert rows["zipar_s1"]["keeps_ar"] == "False" and rows["zipar_s3"]["keeps_ar"] == "True"
    assert float(rows["zipar_s3"]["vs_ar"]) > float(rows["zipar_s3"]["vs_ar_ci95"]) > 0
    # ahead beyond both intervals: zipar_s3 over ar; zipar_s1 is faster than both but worse, so ahead of none
    assert rows["ar"]["behind"] == "zipar_s3" and rows["zipar_s3"]["behind"] == rows["zipar_s1"]["behind"] == ""
    assert rows["zipar_s3"]["knobs"] == "window=3" and rows["zipar_s1"]["knobs"] == "window=1"
    text = (runs / "out" / "frontier.md").read_text()
    assert f"GenEval on {N_QUALITY} prompts, paired" in text
    assert f"{N_SPEED} shared prompts: 1 of {3 * N_SPEED}." in text  # the image the batch changed
    assert (runs / "out" / "frontier.png").stat().st_size > 10_000


def test_an_unfinished_quality_run_is_reported_over_the_prompts_every_point_has(runs, capsys):
    cells = (runs / "quality" / "cells.jsonl").read_text().splitlines()
    assert json.loads(cells[-3])["point"] == "ar"
    (runs / "quality" / "cells.jsonl").write_text("\n".join(cells[:-3] + cells[-2:]) + "\n")  # ar's last batch
    f = frontier.frontier(runs / "speed", runs / "quality")
    assert f["n_quality"] == N_QUALITY - 8
    assert f"GenEval on {N_QUALITY - 8} prompts of the run's {N_QUALITY} (unfinished)" in frontier.report(f)[0]


def test_runs_of_different_worlds_or_a_batched_speed_run_are_refused(runs, capsys):
    assert frontier.main(["--speed", str(runs / "quality"), "--quality", str(runs / "quality")]) == 2
    assert "must be at batch 1" in capsys.readouterr().err
    cfg = OmegaConf.load(runs / "quality" / "config.yaml")
    cfg.prompt_seed = WORLD + 1
    OmegaConf.save(cfg, runs / "quality" / "config.yaml")
    assert frontier.main(["--speed", str(runs / "speed"), "--quality", str(runs / "quality")]) == 2
    assert "different worlds" in capsys.readouterr().err
