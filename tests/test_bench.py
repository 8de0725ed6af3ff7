"""python bench.py end to end on the tiny random zoo: table, CSV, plot, last line, and resume."""

import csv
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mulosd.data.synthscenes.judge import VERSION as judge_version

from .conftest import ROOT, cli_error, compose_config


def _bench(zoo, out, *extra):
    args = [f"infer.models.tokenizer={zoo / 'tok'}", f"infer.models.verifier={zoo / 'ar128'}",
            f"infer.models.drafter={zoo / 'ar64'}", f"infer.models.small={zoo / 'small'}",
            f"infer.models.up={zoo / 'up'}", f"infer.models.down={zoo / 'down'}", f"out_dir={out}",
            f"hydra.run.dir={out / 'h'}", "n_prompts=4", "batch_size=2", "rs=[2]", "taus=[0.0,1.0]", "radii=[1]",
            "infer.acceptance=threshold",  # tau 1 rejects every draft under the threshold test
            *extra]
    return subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_bench_writes_table_csv_plot_and_resumes(tiny_zoo, tmp_path):
    variants = ["+variants.zip={resample:zipar,resample_window:1}", "+variants.w2={resample_window:2}"]
    r = _bench(tiny_zoo, tmp_path, "metrics=[fid,clip,hpsv2]", *variants)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"bench: mulosd_r2 speedup=\d+\.\d\d geneval=\d\.\d{3} ar_geneval=\d\.\d{3} "
                        r"best_peer=\S+ best_peer_speedup=\d+\.\d\d", last), last
    # the time left, told once every point still to run has been timed: after the first batch, for the second
    assert len(re.findall(r"^bench: about (\d+ s|\d+ min|\d+\.\d h) to go \(10 decodes at each point's pace so far\)$",
                          r.stdout, re.M)) == 1, r.stdout[-3000:]
    for name in ("fid", "clip", "hpsv2"):  # offline: each skipped with one line naming what is missing
        assert len([line for line in r.stdout.splitlines() if line.startswith(f"metric {name} skipped: ")]) == 1
    table = (tmp_path / "results.md").read_text()
    for method in ("ar", "zipar", "sd", "lantern", "sjd", "pjd", "mulosd_r2_tau0_l1_zip", "mulosd_r2_tau1_l1_zip",
                   "mulosd_r2_tau0_l1_w2", "mulosd_r2_tau1_l1_w2"):
        assert f"| {method} |" in table, method
    assert (tmp_path / "results.csv").read_text().count("\n") == 11 and (tmp_path / "speedup.png").is_file()
    cells = [json.loads(c) for c in (tmp_path / "cells.jsonl").read_text().splitlines()]
    (where,) = {c["hardware"] for c in cells}  # where it ran, stored with each cell and named in the table
    assert f"timed on {where}, `ar` at " in table.splitlines()[0]
    assert "torch " in table.splitlines()[0] and "threads" in table.splitlines()[0]
    # per-prompt verdicts: each method's GenEval is the mean over categories of their pass rates
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    cats = verdicts["categories"]
    for row in csv.DictReader((tmp_path / "results.csv").open()):
        passed = verdicts["passed"][row["method"]]
        rates = [np.mean([p for p, c in zip(passed, cats, strict=True) if c == k]) for k in sorted(set(cats))]
        assert len(passed) == 4 and float(row["geneval"]) == pytest.approx(np.mean(rates))
    assert len(cells) == 10 * 2
    # hardware-independent counters in every cell: ar makes one token per verifier forward and image
    ar = next(c for c in cells if c["point"] == "ar")
    assert ar["counters"]["tokens_per_verifier_forward"] == 1 and ar["counters"]["accepted_per_verification"] == 0
    assert all(c["counters"]["sequential_steps"] == c["steps"] for c in cells)
    # each variant decoded with its own settings: everything rejected (tau 1), ZipAR within the islands takes
    # fewer verifier forwards at window 1 than at 2
    forwards = {c["point"]: c["forwards"]["verifier"] for c in cells if c["start"] == 0}
    assert forwards["mulosd_r2_tau1_l1_zip"] < forwards["mulosd_r2_tau1_l1_w2"]
    cells = (tmp_path / "cells.jsonl").read_text().splitlines()
    assert all(json.loads(c)["judge"] == judge_version for c in cells)
    # a half-finished run elsewhere, killed while writing a cell: drop the last three cells and cut off the first
    # of them; the rerun computes exactly those three, and the table names both machines. The run was carried
    # here as its cells.jsonl alone (no image of its other points: their verdicts are in the cells), trimmed to
    # the fields a committed run keeps (no counters: the table leaves them blank), except the images of a first
    # cell stored by an older judge, with its verdicts flipped: it is judged again on them.
    kept_fields = ("point", "start", "n", "wall_s", "steps", "passed", "judge")
    elsewhere = [{k: json.loads(c)[k] for k in kept_fields} | {"hardware": "another machine"} for c in cells[:-3]]
    elsewhere[0] |= {"judge": judge_version - 1, "passed": [not v for v in elsewhere[0]["passed"]]}
    (tmp_path / "cells.jsonl").write_text("".join(json.dumps(c) + "\n" for c in elsewhere) + cells[-3][:40])
    for folder in (tmp_path / "images").iterdir():
        if folder.name != elsewhere[0]["point"]:
            shutil.rmtree(folder)
    kept = {(json.loads(c)["point"], json.loads(c)["start"]) for c in cells[:-3]}
    r = _bench(tiny_zoo, tmp_path, "fd=false", *variants)  # FD needs every image
    assert r.returncode == 0, r.stderr[-3000:]
    again = [json.loads(c) for c in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert len(again) == 20 and {(c["point"], c["start"]) for c in again[:17]} == kept
    assert all(c["judge"] == judge_version for c in again)
    assert json.loads((tmp_path / "verdicts.json").read_text())["passed"] == verdicts["passed"]
    header = (tmp_path / "results.md").read_text().splitlines()[0]
    assert f"timed on {' and '.join(sorted([where, 'another machine']))}, " in header, header
    # counters blank where trimmed cells lack them, not made up
    assert re.search(r"^\| ar \| 1\.00x \| \d+ \|  \|  \|  \| ", (tmp_path / "results.md").read_text(), re.M)


@pytest.mark.parametrize("override, key", [
    ("taus=[0.5,1.5]", "taus"), ("rs=[3]", "rs"), ("strategies=[magic]", "strategies"), ("infer.tau=-1", "infer.tau"),
    ("windows=[0]", "windows"), ("+variants.z={resample:zigzag}", "variants.z.resample"),
    ("+variants.z={tua:0.1}", "variants.z.tua"), ("shard=3/2", "shard"), ("shard=half", "shard"),
    ("shard=1/2 resume=false", "shard"),
])
def test_bench_refuses_bad_grids(tmp_path, override, key, capsys):
    """In-process, through bench.py's own checks (the typos battery runs the real interpreter)."""
    assert cli_error("bench.py", [f"out_dir={tmp_path}", *override.split()], tmp_path / "h", capsys) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {key}") and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_two_shards_in_one_out_dir_decode_every_cell_once_and_the_last_summarises(tiny_zoo, tmp_path):
    """One process per core: shard 1/2 takes batches 0 and 2, shard 2/2 batches 1 and 3, appending to one
    cells.jsonl at once; the verdicts are those of the run in one process."""
    def bench(out, *extra):
        args = [f"infer.models.tokenizer={tiny_zoo / 'tok'}", f"infer.models.verifier={tiny_zoo / 'ar128'}",
                f"out_dir={out}", f"hydra.run.dir={out / 'h'}", "n_prompts=4", "batch_size=1",
                "strategies=[zipar]", "windows=[1,2]", "fd=false", *extra]
        return subprocess.Popen([sys.executable, "bench.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    shards = [bench(tmp_path / "shared", f"shard={i}/2") for i in (1, 2)]
    logs = [p.communicate(timeout=900)[0] for p in shards]
    assert all(p.returncode == 0 for p in shards), logs
    assert all("3 points x 2 batches of 1 (shard " in log and "= 6 decodes to run" in log for log in logs), logs
    assert (tmp_path / "shared" / "config.yaml").is_file()
    cells = [json.loads(c) for c in (tmp_path / "shared" / "cells.jsonl").read_text().splitlines()]
    assert sorted((c["point"], c["start"]) for c in cells) == sorted(
        (p, s) for p in ("ar", "zipar_s1", "zipar_s2") for s in range(4))
    assert any(log.strip().splitlines()[-1].startswith("bench: ") and "best_peer" in log for log in logs), logs
    one = bench(tmp_path / "one")
    log = one.communicate(timeout=900)[0]
    assert one.returncode == 0, log
    verdicts = [json.loads((tmp_path / d / "verdicts.json").read_text())["passed"] for d in ("shared", "one")]
    assert verdicts[0] == verdicts[1]


def test_a_variant_that_sets_tau_is_measured_at_its_own_tau():
    from mulosd.config.bench import grid, point_config

    cfg = compose_config("bench", ["strategies=[mulosd]", "rs=[2]", "taus=[0.05,0.1]", "radii=[1]",
                                   "+variants.base={}", "+variants.ratio={acceptance:ratio,tau:0.5}"])
    points = {p.name: p for p in grid(cfg)}
    assert set(points) == {"ar", "mulosd_r2_tau0.05_l1_base", "mulosd_r2_tau0.1_l1_base", "mulosd_r2_tau0.5_l1_ratio"}
    c = point_config(cfg, points["mulosd_r2_tau0.5_l1_ratio"])
    assert c.tau == 0.5 and c.acceptance == "ratio" and c.r == 2 and c.radius == 1


def test_the_start_up_line_names_each_mulosd_setting_and_whether_the_default_runs():
    """Named variants replace today's default: the line says what each point changes, and when the default is
    not among them."""
    from mulosd.bench import mulosd_settings
    from mulosd.config.bench import grid

    base = ["strategies=[zipar,mulosd]", "rs=[2]", "taus=[0.5]", "radii=[2]"]
    cfg = compose_config("bench", [*base, "+variants.paper={expanded:resample,radius:1,draft_rows:4}",
                                   "+variants.up={models:{up:synthscenes_up2_token_ce}}"])
    line = mulosd_settings(cfg, grid(cfg))
    assert "mulosd_r2_tau0.5_l1_paper (radius=1 expanded=resample draft_rows=4)" in line, line
    assert "mulosd_r2_tau0.5_l2_up (models.up=synthscenes_up2_token_ce)" in line, line
    assert line.endswith("today's default is not among them ('+variants.default={}' adds it)"), line
    cfg = compose_config("bench", [*base, "taus=[0.5,1.0]", "+variants.default={}"])
    line = mulosd_settings(cfg, grid(cfg))
    assert line == ("bench: MuLo-SD runs at r=[2]: mulosd_r2_tau0.5_l2_default (today's default), "
                    "mulosd_r2_tau1_l2_default (tau=1.0)"), line
    assert mulosd_settings(cfg, grid(compose_config("bench", ["strategies=[zipar]"]))) == "bench: no MuLo-SD point"
    # a run-wide infer.KEY is named once, not as every point's change
    cfg = compose_config("bench", [*base, "+variants.default={}", "+variants.r1={radius:1}", "infer.cfg_scale=2.0"])
    line = mulosd_settings(cfg, grid(cfg))
    assert line == ("bench: MuLo-SD runs at r=[2] (every point: cfg_scale=2.0): mulosd_r2_tau0.5_l2_default "
                    "(no other change), mulosd_r2_tau0.5_l1_r1 (radius=1)"), line
    # today's default is infer.py's, not the run's infer config
    cfg = compose_config("bench", [*base, "infer.tau=1.0", "taus=[]", "+variants.a={tau:0.5}", "+variants.b={}"])
    line = mulosd_settings(cfg, grid(cfg))
    assert line == ("bench: MuLo-SD runs at r=[2]: mulosd_r2_tau0.5_l2_a (today's default), "
                    "mulosd_r2_l2_b (tau=1.0)"), line


def test_zipar_is_measured_at_each_window_of_the_grid():
    from mulosd.config.bench import grid, point_config

    cfg = compose_config("bench", ["strategies=[zipar,sd]", "windows=[1,3]"])
    points = {p.name: p for p in grid(cfg)}
    assert set(points) == {"ar", "zipar_s1", "zipar_s3", "sd"}
    assert point_config(cfg, points["zipar_s3"]).window == 3
    assert point_config(cfg, points["sd"]).window == cfg.infer.window
    assert {p.name for p in grid(compose_config("bench", ["strategies=[zipar]"]))} == {"ar", "zipar"}


@pytest.mark.slow
def test_throughput_mode_reports_images_per_second_at_each_batch(tiny_zoo, tmp_path, caplog):
    import logging

    from mulosd.bench import run

    cfg = compose_config("bench", [f"infer.models.tokenizer={tiny_zoo / 'tok'}",
                                   f"infer.models.verifier={tiny_zoo / 'ar128'}",
                                   f"infer.models.drafter={tiny_zoo / 'ar64'}", f"infer.models.up={tiny_zoo / 'up'}",
                                   f"infer.models.down={tiny_zoo / 'down'}", f"out_dir={tmp_path}", "n_prompts=4",
                                   "mode=throughput", "throughput_batches=[1,4]", "strategies=[sjd,pjd,mulosd]",
                                   "rs=[2]", "taus=[0.5]", "radii=[1]"])
    with caplog.at_level(logging.INFO):
        rows = run(cfg, tmp_path)["rows"]
    assert [(r["method"], r["batch"]) for r in rows] == [(m, b) for b in (1, 4)
                                                         for m in ("ar", "sjd", "pjd", "mulosd_r2_tau0.5_l1")]
    assert all(r["images_per_s"] > 0 for r in rows) and all(r["vs_ar"] == 1 for r in rows if r["method"] == "ar")
    assert all(r["differ"] == 0 for r in rows)  # every image decodes to the same tokens at batch 1 and 4
    table = (tmp_path / "throughput.md").read_text()
    assert "| sjd | " in table and "batch 4: images/s (vs ar)" in table and "| 0.00% |" in table
    mulosd = {r["batch"]: r["vs_ar"] for r in rows if r["method"] == "mulosd_r2_tau0.5_l1"}
    assert caplog.messages[-1] == (f"throughput: mulosd_r2_tau0.5_l1 batch1={mulosd[1]:.2f}x "
                                   f"batch4={mulosd[4]:.2f}x differ=0.0000")


@pytest.mark.slow
def test_compile_measures_every_point_both_ways_against_the_roofline(tiny_zoo, tmp_path):
    from mulosd.bench import run

    cfg = compose_config("bench", [f"infer.models.tokenizer={tiny_zoo / 'tok'}",
                                   f"infer.models.verifier={tiny_zoo / 'ar128'}", f"out_dir={tmp_path}", "n_prompts=2",
                                   "batch_size=2", "strategies=[]", "compile=true", "fd=false"])
    rows = run(cfg, tmp_path)["rows"]
    assert [r["method"] for r in rows] == ["ar", "ar_compiled"]
    assert rows[0]["geneval"] == rows[1]["geneval"] and rows[0]["steps"] == rows[1]["steps"]  # the same images
    table = (tmp_path / "steps.md").read_text()
    assert "| ar | " in table and "one-token step limit" in table


def test_the_last_line_names_the_fastest_peer_of_equal_quality_including_one_above_ar():
    from mulosd.bench import EQUAL_QUALITY, _last_line

    def row(method, strategy, speedup, geneval, r=""):
        return {"method": method, "strategy": strategy, "speedup": speedup, "geneval": geneval, "r": r}

    ar = row("ar", "ar", 1.0, 0.40)
    rows = [ar, row("zipar_s3", "zipar", 3.1, 0.44), row("zipar_s1", "zipar", 4.9, 0.40 - 2 * EQUAL_QUALITY),
            row("sjd_w16", "sjd", 1.6, 0.40 - EQUAL_QUALITY / 2), row("mulosd_a", "mulosd", 2.3, 0.34, 2),
            row("mulosd_b", "mulosd", 2.0, 0.39, 2)]
    line = _last_line(rows, ar)
    # above ar counts as equal quality; a loss beyond the margin does not, however fast
    assert "best_peer=zipar_s3 best_peer_speedup=3.10" in line, line
    assert "mulosd_r2 speedup=2.00 geneval=0.390" in line, line
    # each ratio measured gets its own entry, in order; r = 4 alone does not print an r = 2 one
    r4 = row("mulosd_c", "mulosd", 4.3, 0.41, 4)
    assert "mulosd_r2 speedup=2.00 geneval=0.390 mulosd_r4 speedup=4.30 geneval=0.410 " in _last_line(rows + [r4], ar)
    only4 = _last_line([ar, r4], ar)
    assert only4.startswith("bench: mulosd_r4 speedup=4.30 ") and "mulosd_r2" not in only4, only4
