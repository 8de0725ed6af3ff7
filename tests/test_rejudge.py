"""Re-judging a finished bench run: today's judge on the run's stored images, next to its stored verdicts."""

import json

import numpy as np
from PIL import Image

from mulosd.data.synthscenes import parse_caption
from mulosd.eval.geneval import prompt_set, reference_renders
from mulosd.reports.rejudge import main, rejudge


def _run(tmp_path, prompts, images, passed):
    for method, ims in images.items():
        (tmp_path / "images" / method).mkdir(parents=True)
        for i, im in enumerate(ims):
            Image.fromarray(im).save(tmp_path / "images" / method / f"{i:04d}.png")
    categories = [parse_caption(p).category for p in prompts]
    (tmp_path / "verdicts.json").write_text(json.dumps({"prompts": prompts, "categories": categories,
                                                        "passed": passed}))
    return tmp_path


def test_rejudging_counts_the_verdicts_today_s_judge_changes(tmp_path, capsys):
    prompts = prompt_set(12)
    rendered = reference_renders(prompts)  # the world's own pictures: today's judge passes every one
    blank = [np.full_like(im, 128) for im in rendered]  # no object at all: it fails every one
    stored = {"ar": [True] * 12, "blank": [True] * 3 + [False] * 9}
    run = _run(tmp_path, prompts, {"ar": rendered, "blank": blank}, stored)
    rows = {r["method"]: r for r in rejudge(run)}
    assert rows["ar"]["after"] == [True] * 12 and rows["ar"]["changed"] == 0
    assert rows["blank"]["after"] == [False] * 12 and rows["blank"]["changed"] == 3
    assert rows["blank"]["geneval_after"] == 0.0 and rows["blank"]["vs_ar_after"][0] == -1.0
    assert main([str(run)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"rejudge: {run.name} methods=2 changed=3/24"


def test_a_directory_that_is_no_run_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
