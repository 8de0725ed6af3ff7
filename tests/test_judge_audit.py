"""The judge audit: its labelled set is the set the command decodes, the command runs end to end on the shipped
zoo, and the image that started the audit (ar's two-coloured cross) is judged as a person judges it."""

import json
import re

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from mulosd.data.synthscenes import judge, parse_caption
from mulosd.data.synthscenes.judge import object_regions
from mulosd.data.synthscenes.scene import realise
from mulosd.data.synthscenes.vocab import CATEGORIES
from mulosd.reports.judge_audit import (
    CHOSEN_ON,
    METHODS,
    REGIONS,
    SETS,
    audit_items,
    load_labels,
    main,
    oracle_agreement,
    region_agreement,
)


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
    text = (tmp_path / "audit.md").read_text()
    assert text.startswith("`python -m mulosd.reports.judge_audit") and "At most what a judge can expect" in text
    assert "Shapes of" in text  # the picked images are of a world with named regions


def test_a_labels_file_that_is_not_one_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "labels.json"
    bad.write_text("{not json")
    assert main(["--labels", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_oracle_bound_counts_sure_labels_as_right_and_a_three_two_majority_by_its_posterior():
    sure = {"sure": True, "pass": True, "labellers": [True, True]}
    split = {"sure": False, "pass": True, "labellers": [True, True, True, False, False]}
    # uniform prior, 3 of 5: the pass rate is Beta(4, 3); P(rate > 1/2) = 1 - P(Bin(6, 1/2) >= 4) = 1 - 22/64
    assert oracle_agreement([sure, split]) == pytest.approx((1 + 42 / 64) / 2)
    assert oracle_agreement([{**split, "pass": False, "labellers": [False] * 5}]) == pytest.approx(1 - 1 / 64)


def test_region_names_are_compared_on_the_regions_the_judge_reads(tmp_path):
    from mulosd.data.synthscenes import render

    scene = realise(parse_caption("a red square on a fading gray background"), np.random.default_rng(2))
    image = render(scene, 128)
    (sl, _), = object_regions(image)
    bbox = [sl[0].start, sl[0].stop, sl[1].start, sl[1].stop]
    path = tmp_path / "regions.json"
    path.write_text(json.dumps({"regions": [
        {"image": "7_ar_000", "bbox": bbox, "shape": "square", "sure": True},
        {"image": "7_ar_000", "bbox": [0, 3, 0, 3], "shape": "none", "sure": True},  # no such region: left out
        {"image": "7_ar_001", "bbox": bbox, "shape": "circle", "sure": True}]}))  # an image not in the rows
    rows = [{"world": 7, "method": "ar", "index": 0}]
    assert region_agreement(rows, [image], path) == [{"image": "7_ar_000", "bbox": bbox, "shape": "square",
                                                      "sure": True, "judge": "square"}]


def test_the_region_names_are_of_audit_images():
    regions = json.loads(REGIONS.read_text())["regions"]
    names = {f"{lab['world']}_{lab['method']}_{lab['index']:03d}" for lab in load_labels()}
    assert len(regions) > 1000 and {g["image"] for g in regions} <= names
    assert {g["shape"] for g in regions} == {"circle", "square", "triangle", "ring", "cross", "none", "several"}
