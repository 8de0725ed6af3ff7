"""The strategy registry is the one place a strategy is declared: what the pipeline loads, what the config checks
allow and what infer.py and bench.py do follow from a Strategy's fields, never from its name. A strategy
registered from this file alone decodes through infer and bench."""

import pytest
import torch

from mulosd.config import ConfigError
from mulosd.config.infer import validate_infer
from mulosd.decoding.registry import STRATEGIES, Strategy, register

from .conftest import compose_config


def _models(zoo) -> list[str]:
    return [f"models.{key}={zoo / name}" for key, name in (("tokenizer", "tok"), ("verifier", "ar128"),
                                                            ("drafter", "ar64"), ("small", "small"), ("up", "up"),
                                                            ("down", "down"))]


def _accept_all(p, cfg, captions, common):
    """The toy: every draft of the small model accepted, i.e. the small model's own image."""
    from mulosd.decoding.ar import decode_ar

    return decode_ar(p.backbone("small", compile=cfg.compile), captions, **common)


@pytest.fixture
def toy():
    strategy = register(Strategy("accept_all", _accept_all, units=lambda cfg, G: G * G, drafts_with="small"))
    yield strategy
    del STRATEGIES[strategy.name]


def test_a_strategy_registered_from_a_test_file_decodes_through_infer_and_bench(toy, tiny_zoo, tmp_path):
    from mulosd import bench, inference

    prompts = "prompts=[two crosses,a red circle,one blue square]"
    common = [*_models(tiny_zoo), prompts, "batch_size=2"]
    got = inference.run(compose_config("infer", [*common, "decoding=accept_all", f"out_dir={tmp_path / 'toy'}"]),
                        tmp_path / "toy")
    alone = [*common, f"models.verifier={tiny_zoo / 'small'}", "decoding=ar", f"out_dir={tmp_path / 'small'}"]
    want = inference.run(compose_config("infer", alone), tmp_path / "small")
    assert len(got["images"]) == 3 and all(map(torch.equal, map(torch.from_numpy, got["images"]),
                                               map(torch.from_numpy, want["images"])))
    run = bench.run(compose_config("bench", [f"infer.{o}" for o in _models(tiny_zoo)] + [
        "strategies=[accept_all]", "n_prompts=2", "batch_size=2", "fd=false", f"out_dir={tmp_path / 'bench'}"]),
        tmp_path / "bench")
    assert [r["method"] for r in run["rows"]] == ["ar", "accept_all"]
    assert "| accept_all |" in (tmp_path / "bench" / "results.md").read_text()


def test_what_a_strategy_declares_is_what_the_config_checks_allow(toy):
    ok = ["prompt=two crosses", "decoding=accept_all"]
    validate_infer(compose_config("infer", ok))
    with pytest.raises(ConfigError, match="decoding: llamagen_t2i decodes with ar, .*no small"):
        validate_infer(compose_config("infer", [*ok, "backbone=llamagen_t2i"]))
    for name, s in STRATEGIES.items():  # every released-backbone refusal follows from drafts_with alone
        cfg = compose_config("infer", ["prompt=a cat", f"decoding={name}", "backbone=tar", "r=2", "tar.resolution=512"])
        if s.drafts_with == "small":
            with pytest.raises(ConfigError, match="decoding: tar decodes with"):
                validate_infer(cfg)
        else:
            validate_infer(cfg)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_pipeline_loads_what_each_strategy_declares_and_nothing_else(tiny_zoo, name):
    from mulosd.pipeline import Pipeline

    cfg = compose_config("infer", [*_models(tiny_zoo), "prompt=two crosses", f"decoding={name}"])
    pipe = Pipeline.from_config(cfg, {name})
    s = STRATEGIES[name]
    assert (pipe.drafter is not None) == (pipe.up is not None) == (pipe.down is not None) == (s.drafts_with ==
                                                                                             "drafter")
    assert (pipe.small is not None) == (s.drafts_with == "small")
    assert (pipe.neighbours is not None) == (s.neighbours is not None)
    if s.neighbours:  # as many nearest codes as its knob asks for
        assert pipe.neighbours.shape[1] == max(cfg[s.neighbours], 1)
    others = [o for o, x in STRATEGIES.items() if x.drafts_with and x.drafts_with != s.drafts_with]
    for other in others:  # a strategy whose models were not loaded is refused with the call that loads them
        with pytest.raises(ValueError, match=f"Pipeline.from_config\\(cfg, {{..., '{other}'}}\\)"):
            pipe.decode(other, cfg, ["two crosses"], torch.arange(1))
    if not s.rounds:
        with pytest.raises(ValueError, match=f"{name} does not record rounds"):
            pipe.decode(name, cfg, ["two crosses"], torch.arange(1), rounds=True)


def test_a_strategy_with_an_unknown_drafter_kind_or_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="drafts_with='big' is not one of"):
        Strategy("x", _accept_all, units=lambda cfg, G: 1, drafts_with="big")
    for name in ("ar", "reference"):
        with pytest.raises(ValueError, match=f"a strategy named '{name}' exists"):
            register(Strategy(name, _accept_all, units=lambda cfg, G: 1))


def test_every_strategy_decodes_an_image_the_same_alone_and_beside_any_neighbours(tiny_zoo):
    """An image's tokens do not depend on the batch it is decoded in: alone, in a batch, and in the same batch
    shuffled, for every registered strategy (each keys its noise and its acceptances per image)."""
    from mulosd.pipeline import Pipeline

    cfg = compose_config("infer", [*_models(tiny_zoo), "prompt=x", "window=2", "gamma=2", "pjd_window=3",
                                   "pjd_start=1", "sjd_window=4"])
    pipe = Pipeline.from_config(cfg, set(STRATEGIES))
    captions = ["two crosses", "a red circle", "one blue square above a green ring"]
    ids = torch.tensor([4, 7, 9])
    order = [2, 0, 1]
    for name in STRATEGIES:
        together = pipe.decode(name, cfg, captions, ids)[0]
        shuffled = pipe.decode(name, cfg, [captions[i] for i in order], ids[order])[0]
        assert torch.equal(shuffled, together[order]), name
        for i, caption in enumerate(captions):
            assert torch.equal(pipe.decode(name, cfg, [caption], ids[i:i + 1])[0][0], together[i]), (name, i)
