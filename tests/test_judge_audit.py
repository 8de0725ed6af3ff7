"""The judge audit: its labelled set is the set the command decodes, the command runs end to end on the shipped
zoo, and the image that started the audit (ar's two-coloured cross) is judged as a person judges it."""

import json
import re

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from mulosd.data.synthscenes import judge, parse_caption
from mulosd.data.synthscenes.vocab import CATEGORIES
from mulosd.reports.judge_audit import CHOSEN_ON, METHODS, SETS, audit_items, load_labels, main


def test_the_labels_cover_the_audit_set_and_say_how_they_were_reached():
    labels = load_labels()
    items = audit_items()
    assert len(labels) == len(items) >= 150
    assert [(lab["world"], lab["method"], lab["index"], lab["caption"], lab["category"]) for lab in labels] == \
        [(it.world, it.method, it.index, it.caption, it.category) for it in items]
    assert {lab["category"] for lab in labels} == set(CATEGORIES) and {lab["method"] for lab in labels} == set(METHODS)
    assert {lab["world"] for lab in labels} == set(SETS) > set(CHOSEN_ON)  # a world no rule was chosen on
    for lab in labels:
        votes = lab["labellers"]
        if lab["sure"]:  # the first two agreed and were both sure: their verdict
            assert votes[0] == votes[1] == lab["pass"] and len(votes) == 2
        else:  # anything less: five people, the majority
            assert len(votes) == 5 and lab["pass"] == (sum(votes) >= 3)
        assert len(lab["labellers_sure"]) == len(lab["seen"]) == len(votes)
    assert 0.1 < np.mean([lab["pass"] for lab in labels]) < 0.9  # both verdicts occur: agreement can fail


@pytest.mark.slow
def test_the_demo_prompts_ar_image_with_a_two_coloured_cross_among_three_is_judged_a_fail():
    from mulosd.config.infer import InferConfig
    from mulosd.pipeline import Pipeline

    caption = "two dotted crosses on a mottled blue background"  # `make demo`'s prompt before the audit
    cfg = OmegaConf.merge(OmegaConf.structured(InferConfig), {"decoding": "ar", "prompt": caption})
    pipe = Pipeline.from_config(cfg, {"ar"})
    tokens, _ = pipe.decode("ar", cfg, [caption], torch.tensor([0]))  # infer.py's image id for its one prompt
    verdict = judge(pipe.images(tokens)[0], parse_caption(caption))
    crosses = [d for d in verdict.detections if d.shape == "cross"]
    assert len(crosses) == 3, verdict.detections  # cyan, orange, and purple-and-red seen as one cross
    assert not verdict.geneval


@pytest.mark.slow
def test_the_audit_command_regenerates_the_labelled_images_and_reports_agreement(tmp_path, capsys):
    labels = load_labels()
    picked = [next(lab for lab in labels if lab["method"] == m) for m in ("ar", "mulosd")]
    path = tmp_path / "labels.json"
    path.write_text(json.dumps({"labels": picked}))
    assert main(["--labels", str(path), "--out", str(tmp_path / "audit.md")]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"judge audit: n=2 agreement=(0\.000|0\.500|1\.000)", out.strip().splitlines()[-1])
    assert "differ from the labelled ones" not in out  # the decode reproduced the images people looked at
    assert (tmp_path / "audit.md").read_text().startswith("`python -m mulosd.reports.judge_audit")


def test_a_labels_file_that_is_not_one_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "labels.json"
    bad.write_text("{not json")
    assert main(["--labels", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
