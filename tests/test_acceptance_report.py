"""The acceptance budget report: its rates by hand, object tokens by hand, and one run on the shipped zoo."""

import numpy as np
import pytest
import torch

from mulosd.reports.acceptance import Rung, needed_rate, object_tokens


def test_rates_under_the_ratio_and_the_threshold_test_by_hand():
    rung = Rung("x")
    rung.add(torch.tensor([[0.6, 0.2, 0.05]]), torch.tensor([[0.5, 0.8, 1.0]]), torch.tensor([[True, False, False]]))
    rung.done()
    # ratio: min(1, mass / (tau q)) = min(1, 0.6 / 0.25), 0.2 / 0.4, 0.05 / 0.5
    assert torch.allclose(rung.passed(0.5), torch.tensor([[1.0, 0.5, 0.1]]))
    assert torch.equal(rung.passed(0.5, "threshold"), torch.tensor([[1.0, 0.0, 0.0]]))
    assert torch.allclose(rung.passed(0.5, "sampled"), torch.tensor([[1.0, 0.4, 0.1]]))  # min(1, mass / tau)


def test_object_tokens_are_the_patches_holding_saturated_pixels():
    image = np.full((16, 16, 3), 110, dtype=np.uint8)  # grey background
    image[9:11, 3:5] = (220, 30, 30)  # a red speck across patches (2, 0) and (2, 1) of a 4 x 4 grid
    got = object_tokens([image], 4)[0].view(4, 4)
    want = torch.zeros(4, 4, dtype=torch.bool)
    want[2, 0] = want[2, 1] = True
    assert torch.equal(got, want)


def test_the_rate_a_speed_needs_is_read_between_the_measured_points():
    rates, speeds = [0.7, 0.9, 1.0], [0.8, 1.0, 1.6]
    assert needed_rate(rates, speeds, 1.3) == pytest.approx(0.95)  # half-way from 1.0x at 0.9 to 1.6x at 1.0
    assert needed_rate(rates, speeds, 1.0) == 0.9  # a measured point that reaches it
    assert needed_rate(rates, speeds, 0.5) == 0.7  # every measured rate does: the lowest one
    assert needed_rate(rates, speeds, 2.0) is None  # none does


@pytest.mark.slow
def test_the_report_on_the_shipped_zoo(tmp_path, capsys):
    from mulosd.reports.acceptance import main

    out = tmp_path / "acceptance.md"
    assert main(["--n", "2", "--batch", "2", "--out", str(out), "expanded=reverify"]) == 0
    line, ceiling = capsys.readouterr().out.strip().splitlines()[-2:]
    assert line.startswith("acceptance: own=") and ceiling.startswith("ceiling: 1.2x zipar_w3 needs accept>=")
    rates = dict(kv.split("=") for kv in line.split()[1:])
    assert set(rates) == {"own", "up_token_ce", "up_gan", "lanczos", "drafter", "raw", "kept"}
    assert all(0 <= float(v) <= 1 for v in rates.values())
    text = out.read_text()
    assert "expanded=reverify" in text and "| decoding: kept |" in text
    assert text.count("| img>U_r") == 2 * 3  # each stage in the ladder, then over tau
    steps = next(r for r in text.splitlines() if r.startswith("| sequential steps, mean"))
    prefix, draft, verify, resample, total = (float(c) for c in steps.split("|")[2:7])
    assert prefix + draft + verify + resample == pytest.approx(total)
    forced_all = next(r for r in text.splitlines() if r.startswith("| forced 1 |")).split("|")
    assert float(forced_all[3]) == 0 and float(forced_all[4]) == 1  # every draft accepted: nothing resampled
    peer = next(r for r in text.splitlines() if r.startswith("| zipar w3 |")).split("|")
    assert float(peer[2]) == 61  # 16 rows of 16, each row 3 tokens behind the one above: 16 + 15 * 3 steps
    assert main(["--n", "2", "r=4"]) == 2  # at 128 px the zoo has no 32 px drafter for r = 4


def test_the_ladder_measures_the_stages_the_zoo_holds():
    from omegaconf import OmegaConf

    from mulosd.choices import SAMPLER_STAGES
    from mulosd.config.infer import InferConfig
    from mulosd.reports.acceptance import Budget

    def stages(*overrides):
        cfg = OmegaConf.merge(OmegaConf.structured(InferConfig), OmegaConf.from_dotlist(list(overrides)))
        return Budget(cfg, 4242, 1, 1).stages

    assert stages() == list(SAMPLER_STAGES)  # r = 2 at 128 px: every stage ships
    assert stages("size=256", "models.verifier=synthscenes_ar_v3", "r=4") == ["gan"]  # U_4 at 256 px: GAN only
