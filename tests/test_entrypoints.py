import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mulosd.config.infer import DECODINGS
from mulosd.data.synthscenes import judge, parse_caption
from mulosd.eval import REPORT_WORLD

from .conftest import ROOT


def _run(*args):
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_preview_writes_a_labelled_grid(tmp_path):
    out = tmp_path / "p.png"
    r = _run("-m", "mulosd.data.synthscenes", "preview", "--out", str(out), "--n", "6", "--cols", "3")
    im = Image.open(out)
    assert im.size[0] > 3 * 128 and im.size[1] > 2 * 128 and "wrote" in r.stdout


@pytest.mark.slow
def test_shards_command_writes_laion_layout(tmp_path):
    _run("-m", "mulosd.data.synthscenes", "shards", "--out", str(tmp_path), "--num-shards", "2",
         "--val-shards", "1", "--per-shard", "3", "--size", "32", "--seed", "1")
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["train-00000.tar", "train-00001.tar", "val-00000.tar"]


@pytest.mark.slow
def test_judge_selftest_prints_its_last_line():
    r = _run("-m", "mulosd.data.synthscenes", "judge-selftest", "--n", "12")
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("judge agreement: ") and float(last.split(": ")[1]) >= 0.9


@pytest.mark.slow
def test_inspect_data_streams_the_synthscenes_recipe(tmp_path, synth_shards):
    run_dir = tmp_path / "run"
    r = _run("train.py", "experiment=inspect_data", f"hydra.run.dir={run_dir}", "inspect.num_batches=3",
             f"data.synth.dir={tmp_path / 'shards'}", "data.synth.train_shards=2", "data.synth.val_shards=1",
             "data.synth.per_shard=8", "data.synth.size=64", "data.image_size=64", "data.batch_size=4",
             "data.num_workers=1")
    assert "12 samples, 0 skipped" in r.stdout
    assert (run_dir / "batch0.png").is_file() and len(list((tmp_path / "shards").glob("*.tar"))) == 3


@pytest.mark.slow
def test_inspect_data_on_user_shards(tmp_path, synth_shards):
    """The LAION path: the same pipeline over shards the user points at."""
    r = _run("train.py", "experiment=inspect_data", "data=laion_coco_aesthetic", f"hydra.run.dir={tmp_path}",
             f"data.train_urls='{synth_shards}/train-{{00000..00001}}.tar'", "data.image_size=64",
             "data.batch_size=8", "data.num_workers=0", "inspect.num_batches=2")
    assert "16 samples, 0 skipped" in r.stdout


@pytest.mark.slow
def test_infer_renders_prompts_that_the_judge_accepts(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle above a blue square on a striped green background\n\nthree dotted rings\n")
    _run("infer.py", "decoding=reference", f"prompt_file={prompts}", f"out_dir={tmp_path}",
         f"hydra.run.dir={tmp_path / 'h'}")
    for i, text in enumerate(["a red circle above a blue square on a striped green background", "three dotted rings"]):
        img = np.asarray(Image.open(tmp_path / f"{i:03d}.png"))
        assert img.shape == (128, 128, 3) and judge(img, parse_caption(text)).ok
    assert (tmp_path / "grid.png").is_file()


@pytest.mark.parametrize("args", [["infer.py", "--help"], ["infer.py", "draft_rows=0"], ["bench.py", "taus=[3]"],
                                  ["bench.py", "--help"]])
def test_help_and_a_config_error_load_no_torch(args, tmp_path):
    """The schemas, the registry and the knobs are torch-free: asking for help or making a mistake costs no torch
    import (python -X importtime lists every module imported)."""
    r = subprocess.run([sys.executable, "-X", "importtime", *args, f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert imported and not [m for m in imported if m.split(".")[0] == "torch"], r.stderr[-2000:]
    assert r.returncode == (0 if "--help" in args else 2)


def test_infer_help_lists_inference_options_only():
    out = _run("infer.py", "--help").stdout
    assert "tau:" in out and "compare_repeats:" in out and "python infer.py" in out
    usage = out.split("Every option")[0]  # the usage lines name every decoding a user can ask for
    listed = re.search(r"decoding=([\w|]+)", usage).group(1).split("|")
    assert sorted(listed) == sorted(DECODINGS)
    for training in ("experiment:", "trainer:", "Configuration groups", "zoo_tokenizer"):
        assert training not in out, training


@pytest.mark.slow
def test_infer_log_holds_what_the_run_printed(tmp_path):
    r = _run("infer.py", "decoding=reference", "prompts=[a red circle,two dotted rings]", f"out_dir={tmp_path}",
             f"hydra.run.dir={tmp_path / 'h'}")
    printed = [line for line in r.stdout.splitlines() if line.strip()]
    logged = (tmp_path / "h" / "infer.log").read_text()
    assert len(printed) == 3 and all(line in logged for line in printed)


def test_zoo_cycle_refuses_bad_arguments_before_touching_anything(tmp_path):
    """scripts/zoo_cycle.sh: a cycle past the first needs the export it starts from, and SHARDS may not reach into
    the next cycle's shards; both are one-line errors before any run directory exists."""
    env = {"PATH": "/usr/bin:/bin", "RUNS": str(tmp_path / "runs")}
    for args, extra, says in ((["2"], {}, "starts from the previous cycle's export"),
                              (["5", "zoo/synthscenes_ar_v2"], {"SHARDS": "97"}, "next cycle's shards")):
        r = subprocess.run(["bash", "scripts/zoo_cycle.sh", *args], cwd=ROOT, env=env | extra, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_later_cycle_trains_from_its_start_at_the_lower_peak_learning_rate(tmp_path):
    """scripts/zoo_cycle.sh's training command, read through a stand-in interpreter that records it: cycle 1 keeps
    the recipe's learning rate, a later cycle gets LR (default or given), and an lr override wins over both; a
    cycle trains on its own fresh shards unless FIRST_SHARD names others."""
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\nexit 1\n')
    fake.chmod(0o755)

    def command(*args, keys=("model.optim.lr=", "model.init_from="), **env):
        out = tmp_path / "args.txt"
        out.unlink(missing_ok=True)
        subprocess.run(["bash", "scripts/zoo_cycle.sh", *args], cwd=ROOT, capture_output=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "RUNS": str(tmp_path / "runs"), "PY": str(fake),
                            "ARGS_OUT": str(out), **env})
        return [a for a in out.read_text().splitlines() if a.startswith(keys)]

    assert command("1") == []
    assert command("2", "zoo/synthscenes_ar_v2") == ["model.init_from=zoo/synthscenes_ar_v2", "model.optim.lr=3e-4"]
    assert command("2", "zoo/synthscenes_ar_v2", LR="1e-4")[1:] == ["model.optim.lr=1e-4"]
    assert command("2", "zoo/synthscenes_ar_v2", "model.optim.lr=5e-4") == [
        "model.optim.lr=5e-4", "model.init_from=zoo/synthscenes_ar_v2"]
    shards = ("data.synth.first_shard=",)
    assert command("3", "zoo/synthscenes_ar_v2", keys=shards) == ["data.synth.first_shard=192"]
    assert command("3", "zoo/synthscenes_ar_v2", keys=shards, FIRST_SHARD="0") == ["data.synth.first_shard=0"]


def test_frontier256_resumes_from_committed_cells_and_times_only_after_quality(tmp_path):
    """scripts/frontier256.sh through a stand-in interpreter that records each shard's command: a new run folder
    starts from the committed quality cells, the speed shards start once both quality shards have ended well, and
    a failed quality shard leaves the speed run unstarted."""
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\nline=""\n'  # a shard's line in one write: the two shards append at once
                    'for a; do case $a in out_dir=*|shard=*|batch_size=*) line="$line$a ";; esac; done\n'
                    'printf "%s\\n" "$line" >> "$CALLS"\ncase "$*" in *"$FAIL"*) exit 1;; esac\n')
    fake.chmod(0o755)

    def run(*args, fail="no shard fails"):
        calls = tmp_path / "calls.txt"
        calls.unlink(missing_ok=True)
        runs = tmp_path / "runs"
        r = subprocess.run(["bash", "scripts/frontier256.sh", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, env={"PATH": "/usr/bin:/bin", "RUNS": str(runs), "PY": str(fake),
                                            "CALLS": str(calls), "FAIL": fail})
        lines = calls.read_text().splitlines() if calls.exists() else []
        return r, sorted(lines)

    world = str(REPORT_WORLD)
    r, calls = run(world)
    assert r.returncode == 0, r.stderr
    runs = tmp_path / "runs"
    assert calls == [f"batch_size=1 out_dir={runs}/speed_{world} shard={i}/2 " for i in (1, 2)] + [
        f"batch_size=8 out_dir={runs}/quality_{world} shard={i}/2 " for i in (1, 2)]
    committed = (ROOT / f"docs/frontier256/quality_{world}/cells.jsonl").read_text()
    assert (runs / f"quality_{world}/cells.jsonl").read_text() == committed
    assert r.stdout.index("quality: complete") < r.stdout.index("speed: shard 1/2")

    (runs / f"quality_{world}/cells.jsonl").write_text("")  # a run folder that has cells of its own keeps them
    r, calls = run(world, fail=f"quality_{world} shard=2/2")
    assert r.returncode == 1 and "quality: a shard failed" in r.stderr
    assert calls == [f"batch_size=8 out_dir={runs}/quality_{world} shard={i}/2 " for i in (1, 2)]
    assert (runs / f"quality_{world}/cells.jsonl").read_text() == ""
    for args, says in (([world, "speed", "sizes"], "unknown phase 'sizes'"), (["quality"], "name the world")):
        r, calls = run(*args)
        assert r.returncode == 2 and says in r.stderr and calls == [], r.stderr
