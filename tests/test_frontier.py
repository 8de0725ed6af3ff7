"""python -m mulosd.reports.frontier on two synthetic bench runs (cells.jsonl and config.yaml, no image): speed
from the batch-1 run with a bootstrap interval, GenEval from the longer run paired against ar, and "ahead" only
beyond both intervals."""

import csv
import json
import re

import numpy as np
import pytest
from omegaconf import OmegaConf

from mulosd.data.synthscenes.judge import VERSION
from mulosd.reports import frontier

from .conftest import compose_config

WORLD = 8128
N_SPEED, N_QUALITY = 40, 120


def _run(folder, n, batch, walls, passed, steps, windows="[1,2,3]"):
    """A bench run over zipar's windows: each point's wall time per prompt and verdicts."""
    cfg = compose_config("bench", ["strategies=[zipar]", f"windows={windows}", f"n_prompts={n}",
                                   f"batch_size={batch}", f"prompt_seed={WORLD}"])
    folder.mkdir()
    OmegaConf.save(cfg, folder / "config.yaml")
    with (folder / "cells.jsonl").open("w") as f:
        for start in range(0, n, batch):
            for point in walls:
                cell = {"point": point, "start": start, "n": batch, "steps": steps[point],
                        "wall_s": float(sum(walls[point][start:start + batch])),
                        "passed": passed[point][start:start + batch], "judge": VERSION}
                f.write(json.dumps(cell) + "\n")


@pytest.fixture
def runs(tmp_path):
    rng = np.random.default_rng(0)
    ar = [bool(v) for v in rng.random(N_QUALITY) < 0.4]
    better = [bool(a or rng.random() < 0.5) for a in ar]  # passes everything ar passes and half of the rest
    near = list(better)
    near[better.index(False)] = True  # one more image passes: not better beyond the interval
    passed = {"ar": ar, "zipar_s1": [False] * N_QUALITY, "zipar_s2": near, "zipar_s3": better}
    steps = {"ar": 256, "zipar_s1": 31, "zipar_s2": 46, "zipar_s3": 61}
    speed_passed = {k: list(v[:N_SPEED]) for k, v in passed.items()}
    speed_passed["zipar_s3"][0] = not speed_passed["zipar_s3"][0]  # a batch that changed one image
    walls = {k: (1.0 / s) * (1 + 0.1 * rng.standard_normal(N_SPEED)) for k, s in
             {"ar": 1.0, "zipar_s1": 4.0, "zipar_s2": 2.1, "zipar_s3": 2.0}.items()}
    _run(tmp_path / "speed", N_SPEED, 1, walls, speed_passed, steps)
    _run(tmp_path / "quality", N_QUALITY, 8, {k: np.ones(N_QUALITY) for k in walls}, passed, steps)
    # a later pair of runs, on a machine twice as slow: its own ar, and zipar window 4 at 3x that ar
    later = {"ar": 2 * walls["ar"], "zipar_s4": 2 * walls["ar"] / 3 * (1 + 0.05 * rng.standard_normal(N_SPEED))}
    later_passed = {"ar": ar, "zipar_s4": better}
    later_steps = {"ar": 512, "zipar_s4": 76}  # steps, too, count against the pair's own ar
    _run(tmp_path / "speed4", N_SPEED, 1, later, {k: v[:N_SPEED] for k, v in later_passed.items()}, later_steps,
         windows="[4]")
    _run(tmp_path / "quality4", N_QUALITY, 8, {k: np.ones(N_QUALITY) for k in later}, later_passed, later_steps,
         windows="[4]")
    return tmp_path


def test_the_frontier_joins_speed_and_quality_with_their_intervals(runs, capsys):
    assert frontier.main(["--speed", str(runs / "speed"), "--quality", str(runs / "quality"),
                          "--out", str(runs / "out")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = re.fullmatch(r"frontier: fastest_at_ar_quality=zipar_s2 speedup=(\d\.\d\d) mulosd_best=none "
                        r"mulosd_speedup=0\.00 best_peer=zipar_s2 best_peer_speedup=(\d\.\d\d) "
                        r"mulosd_over_peer=0\.00 steps_mulosd_best=none steps_mulosd_speedup=0\.00 "
                        r"steps_best_peer=zipar_s2 steps_best_peer_speedup=5\.57 steps_mulosd_over_peer=0\.00 "
                        r"points=4", lines[-1])
    assert last and abs(float(last[1]) - 2.1) < 0.15 and last[1] == last[2], lines[-1]  # ar's walls / 2.1, +-10%
    rows = {r["method"]: r for r in csv.DictReader((runs / "out" / "frontier.csv").open())}
    assert float(rows["zipar_s1"]["speedup_lo"]) < 4 < float(rows["zipar_s1"]["speedup_hi"]) < 4.4
    assert rows["zipar_s1"]["keeps_ar"] == "False" and rows["zipar_s3"]["keeps_ar"] == "True"
    assert float(rows["zipar_s3"]["vs_ar"]) > float(rows["zipar_s3"]["vs_ar_ci95"]) > 0
    # ahead beyond both intervals: zipar_s2 and s3 over ar; zipar_s1 is faster than all but worse, so ahead of
    # none; zipar_s2 is a little faster and a little better than s3, within both intervals: not ahead of it
    assert rows["ar"]["behind"] == "zipar_s2 zipar_s3"
    assert rows["zipar_s3"]["behind"] == rows["zipar_s2"]["behind"] == rows["zipar_s1"]["behind"] == ""
    assert rows["zipar_s3"]["knobs"] == "window=3" and rows["ar"]["knobs"] == "defaults"
    text = (runs / "out" / "frontier.md").read_text()
    assert f"GenEval on {N_QUALITY} prompts, paired" in text
    assert f"{N_SPEED} shared prompts: 1 of {4 * N_SPEED}." in text  # the image the batch changed
    assert (runs / "out" / "frontier.png").stat().st_size > 10_000


def test_the_last_line_sets_mulosd_against_the_fastest_peer_at_ar_quality_by_wall_clock_and_by_steps():
    """MuLo-SD's fastest point and the fastest peer, each among the points that keep `ar`'s quality: a faster
    point that loses it is passed over, and the two measures may pick different points."""
    def row(method, strategy, speedup, steps_speedup, keeps):
        return {"method": method, "strategy": strategy, "speedup": speedup, "steps_speedup": steps_speedup,
                "keeps_ar": keeps}

    rows = [row("ar", "ar", 1.0, 1.0, True), row("zipar_s1", "zipar", 5.0, 30.0, False),
            row("zipar_s3", "zipar", 2.0, 8.0, True), row("pjd", "pjd", 1.5, 9.0, True),
            row("mulosd_a", "mulosd", 1.8, 10.0, True), row("mulosd_b", "mulosd", 2.5, 7.0, True),
            row("mulosd_c", "mulosd", 4.0, 20.0, False)]
    assert frontier.headline(rows) == (
        "frontier: fastest_at_ar_quality=mulosd_b speedup=2.50 mulosd_best=mulosd_b mulosd_speedup=2.50 "
        "best_peer=zipar_s3 best_peer_speedup=2.00 mulosd_over_peer=1.25 steps_mulosd_best=mulosd_a "
        "steps_mulosd_speedup=10.00 steps_best_peer=pjd steps_best_peer_speedup=9.00 steps_mulosd_over_peer=1.11 "
        "points=7")


def test_an_unfinished_quality_run_is_reported_over_the_prompts_every_point_has(runs, capsys):
    cells = (runs / "quality" / "cells.jsonl").read_text().splitlines()
    assert json.loads(cells[-4])["point"] == "ar"
    (runs / "quality" / "cells.jsonl").write_text("\n".join(cells[:-4] + cells[-3:]) + "\n")  # ar's last batch
    f = frontier.frontier([(runs / "speed", runs / "quality")])
    assert f["n_quality"] == N_QUALITY - 8
    assert f"GenEval on {N_QUALITY - 8} prompts of the run's {N_QUALITY} (unfinished)" in frontier.report(f)[0]


def test_a_later_pair_of_runs_joins_with_speed_ups_against_its_own_ar(runs, capsys):
    pairs = [(runs / "speed", runs / "quality"), (runs / "speed4", runs / "quality4")]
    f = frontier.frontier(pairs)
    rows = {r["method"]: r for r in f["rows"]}
    assert [r["method"] for r in f["rows"]].count("ar") == 1 and f["ar_differ"] == 0
    assert abs(rows["zipar_s4"]["speedup"] - 3) < 0.15  # against the later run's ar, not the first run's (1.5)
    assert rows["zipar_s4"]["steps_speedup"] == 512 / 76 and rows["zipar_s3"]["steps_speedup"] == 256 / 61
    assert rows["zipar_s4"]["vs_ar"] == rows["zipar_s3"]["vs_ar"]  # the same verdicts, paired against ar
    # faster than zipar_s3 beyond the interval (3x against 2x) but not better: ahead of ar only
    assert "zipar_s4" in rows["ar"]["behind"] and "zipar_s4" not in rows["zipar_s3"]["behind"]
    assert "`ar`'s verdicts that differ between the quality runs: 0." in frontier.report(f)[0]
    assert frontier.main(["--speed", str(runs / "speed"), str(runs / "speed4"), "--quality",
                          str(runs / "quality")]) == 2
    assert "give them in pairs" in capsys.readouterr().err
    assert frontier.main(["--speed", str(runs / "speed"), str(runs / "speed"), "--quality", str(runs / "quality"),
                          str(runs / "quality")]) == 2
    assert "a point is measured by two pairs: ['zipar_s1', 'zipar_s2', 'zipar_s3']" in capsys.readouterr().err


def test_runs_of_different_worlds_or_a_batched_speed_run_are_refused_and_other_threads_are_not(runs, capsys):
    assert frontier.main(["--speed", str(runs / "quality"), "--quality", str(runs / "quality")]) == 2
    assert "must be at batch 1" in capsys.readouterr().err
    original = (runs / "quality" / "config.yaml").read_text()
    for key, value, error in (("prompt_seed", WORLD + 1, "decode different images"),
                              ("seed", 1, "decode different images"),
                              ("infer.temperature", 0.5, f"ar decodes with other settings in {runs / 'quality'} "
                                                         f"than in {runs / 'speed'}: temperature")):
        cfg = OmegaConf.load(runs / "quality" / "config.yaml")
        OmegaConf.update(cfg, key, value)
        OmegaConf.save(cfg, runs / "quality" / "config.yaml")
        assert frontier.main(["--speed", str(runs / "speed"), "--quality", str(runs / "quality")]) == 2
        assert error in capsys.readouterr().err, key
        (runs / "quality" / "config.yaml").write_text(original)
    cfg = OmegaConf.load(runs / "speed" / "config.yaml")
    OmegaConf.update(cfg, "infer.threads", 1)  # how a run executes, not what it decodes
    OmegaConf.save(cfg, runs / "speed" / "config.yaml")
    assert frontier.main(["--speed", str(runs / "speed"), "--quality", str(runs / "quality")]) == 0
