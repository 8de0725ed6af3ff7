"""python infer.py end to end on a tiny zoo made here (random weights: the plumbing, not the quality):
every strategy, compare=true with its last line, acceptance maps, and refusals before any decoding."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mulosd.config.bench import validate_bench
from mulosd.config.infer import DECODINGS, validate_infer
from mulosd.decoding.registry import STRATEGIES
from mulosd.pipeline import Pipeline

from .conftest import ROOT, assert_quiet_logs, cli_error, compose_config


@pytest.mark.slow
def test_infer_and_the_bench_accept_exactly_the_registered_strategies():
    assert DECODINGS == (*STRATEGIES, "reference")
    for name in STRATEGIES:
        validate_infer(compose_config("infer", [f"decoding={name}"]))
    for name in set(STRATEGIES) - {"ar"}:  # ar is always measured
        validate_bench(compose_config("bench", [f"strategies=[{name}]"]))


def test_every_knob_has_one_default_and_a_command_line_key():
    """Each strategy's dataclass is the source of its knobs: every field a strategy reads from a config is an infer
    key whose schema default is the dataclass's, no other part of the schema or conf/infer.yaml sets it, and each
    knob's range check is reachable from the command line."""
    from dataclasses import MISSING, fields

    from omegaconf import OmegaConf

    from mulosd.config.bench import BenchConfig
    from mulosd.config.infer import InferConfig, InferOptions

    schema = {f.name: f for f in fields(InferConfig)}
    composed = compose_config("infer", [])
    own = {f.name for f in fields(InferOptions)}
    seen = set()
    for strategy in STRATEGIES.values():
        for f in fields(strategy.config) if strategy.config else ():
            key = f.metadata.get("key", f.name)
            if key is None:  # set by the strategy itself (sd / lantern's acceptance)
                continue
            assert key in schema and key not in own, key
            assert schema[key].default == f.default and f.default is not MISSING, key
            assert composed[key] == f.default, f"{key}: conf/infer.yaml sets it again"
            assert f.metadata.get("help"), f"{key}: no help text"
            seen.add(key)
        for axis in strategy.sweep:  # bench sweeps command-line knobs, over lists of BenchConfig
            assert axis.key in schema and axis.values in {f.name for f in fields(BenchConfig)}, axis
    assert set(schema) == own | seen, "every schema field is an option of the run or a knob of a strategy"
    # conf/infer.yaml chooses nothing: every default is the schema's
    assert OmegaConf.to_container(composed) == OmegaConf.to_container(OmegaConf.structured(InferConfig))


@pytest.mark.parametrize("key, value", [("tau", -1), ("draft_rows", 0), ("sjd_window", 0), ("window", 0),
                                        ("gamma", 0), ("lantern_delta", 2), ("draft_cfg_scale", -1)])
def test_each_knobs_range_check_answers_for_its_command_line_key(key, value):
    with pytest.raises(ValueError, match=f"^{key}: "):
        validate_infer(compose_config("infer", [f"{key}={value}"]))


def test_the_registry_is_the_whole_recipe():
    """One entry per strategy, named functions (jump-to-definition reaches the decoder), and the bench's grid
    measures every strategy a user names, by the registry's axes."""
    from mulosd.config.bench import grid

    for name, s in STRATEGIES.items():
        assert s.name == name and s.run.__name__ == f"run_{name}" and s.drafts_with in (None, "drafter", "small")
    points = grid(compose_config("bench", ["rs=[2]", "taus=[0.5]", "radii=[1]", "windows=[2]"]))
    assert {p.strategy for p in points} == set(STRATEGIES)
    assert {p.name for p in points} >= {"ar", "zipar_s2", "sjd", "mulosd_r2_tau0.5_l1"}


def _infer(zoo, tmp_path, *extra, env=None):
    args = [f"models.tokenizer={zoo / 'tok'}", f"models.verifier={zoo / 'ar128'}", f"models.drafter={zoo / 'ar64'}",
            f"models.small={zoo / 'small'}", f"models.up={zoo / 'up'}", f"models.down={zoo / 'down'}",
            f"out_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'h'}", *extra]
    return subprocess.run([sys.executable, "infer.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)


@pytest.mark.slow
def test_mulosd_with_compare_writes_images_maps_and_the_speedup_line(tiny_zoo, tmp_path):
    r = _infer(tiny_zoo, tmp_path, "prompts=[a red circle above a blue square,three dotted rings]", "compare=true",
               "tau=0.05")
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"speedup=(\d+\.\d\d) spread=(\d+\.\d\d)-(\d+\.\d\d) repeats=3 judge_mulosd=\d\.\d{3} "
                     r"judge_ar=\d\.\d{3}", last)
    assert m, last
    median, lo, hi = map(float, m.groups())
    assert lo <= median <= hi
    # the times printed are the median repeat's: their ratio is the speed-up reported
    ours, ar = (float(re.search(rf"^{s}: \d+ images in (\d+\.\d\d) s", r.stdout, re.M).group(1))
                for s in ("mulosd", "ar"))
    assert abs(ar / ours - median) <= 0.01 + median * 0.01 / min(ours, ar), (ar, ours, median)
    for name in ("000.png", "001.png", "grid.png", "grid_ar.png", "acceptance_000.png"):
        assert (tmp_path / name).is_file(), name
    assert_quiet_logs(r, tmp_path / "h" / "infer.log")
    assert last in (tmp_path / "h" / "infer.log").read_text()
    assert "mulosd:" in r.stdout and "sequential steps" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("decoding", [s for s in STRATEGIES if s != "mulosd"])
def test_every_baseline_decodes_through_infer(tiny_zoo, tmp_path, decoding):
    r = _infer(tiny_zoo, tmp_path, f"decoding={decoding}", "prompt=two crosses", "batch_size=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "000.png").is_file() and f"{decoding}" in r.stdout


@pytest.mark.parametrize("override,key", [
    ("tau=1.5", "tau"), ("tau=nan", "tau"), ("r=3", "r"), ("prompt=a purple unicorn", "prompt"),
    ("models.up=UP_OTHER", "models.up"), ("models.verifier=/nonexistent", "models.verifier"),
    ("radius=-1", "radius"), ("stage=adversarial", "stage"), ("draft_cfg_scale=-2", "draft_cfg_scale"),
    ("cfg_schedule=cosine", "cfg_schedule"),
])
def test_bad_requests_fail_before_decoding_with_one_line(tiny_zoo, tmp_path, override, key, capsys):
    """In-process (test_cli_typo_exits_nonzero_naming_the_key runs a real interpreter for the exit path)."""
    models = [f"models.{k}={tiny_zoo / v}" for k, v in (("tokenizer", "tok"), ("verifier", "ar128"),
                                                         ("drafter", "ar64"), ("small", "small"), ("up", "up"),
                                                         ("down", "down"))]
    overrides = [*models, f"out_dir={tmp_path}", override.replace("UP_OTHER", str(tiny_zoo / "up_other"))]
    assert cli_error("infer.py", overrides, tmp_path / "h", capsys) == 2
    err = capsys.readouterr().err
    assert f"error: {key}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "000.png").exists()


@pytest.mark.slow
def test_llamagen_without_its_checkpoints_names_the_missing_files(tmp_path):
    args = ["backbone=llamagen_t2i", "prompt=a cat", f"llamagen.ckpt_dir={tmp_path / 'none'}",
            f"hydra.run.dir={tmp_path / 'h'}"]
    r = subprocess.run([sys.executable, "infer.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    for name in ("vq_ds16_t2i.pt", "t2i_XL_stage1_256.pt", "t2i_XL_stage2_512.pt", "huggingface.co/peizesun"):
        assert name in line


@pytest.mark.slow
def test_prompts_decoded_across_two_processes_match_one_process_in_order(tiny_zoo, tmp_path):
    """devices=2: Lightning's predict loop with DDP (gloo on CPU); every image is the one a single process
    decodes for that prompt, written under its prompt's index."""
    prompts = "prompts=[a red circle,two crosses,a blue square above a green ring,three dotted rings,a yellow triangle]"
    # batch 1 and one thread in both runs: float32 results depend on the batch's shape and on the thread count
    # (the ranks batch differently, and Lightning gives each rank its share of the cores)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = _infer(tiny_zoo, tmp_path / "one", prompts, "decoding=mulosd", "tau=0.05", "batch_size=1", env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    two = _infer(tiny_zoo, tmp_path / "two", prompts, "decoding=mulosd", "tau=0.05", "batch_size=1", "devices=2",
                 env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "on 2 processes" in two.stdout
    for i in range(5):
        a, b = (np.asarray(Image.open(tmp_path / d / f"{i:03d}.png")) for d in ("one", "two"))
        assert np.array_equal(a, b), i
    assert (tmp_path / "two" / "grid.png").is_file()


def test_draft_cfg_scale_guides_the_drafter_only(tiny_zoo):
    """One tau=0 round drafts the whole low-res image greedily and serially: it is the drafter's greedy AR decode at
    draft_cfg_scale, not at the verifier's scale, and the verifier's own guidance is untouched."""
    from mulosd.ar import ARBackbone, Warpers
    from mulosd.decoding.ar import decode_ar
    from mulosd.pipeline import Pipeline

    models = ["tokenizer=tok", "verifier=ar128", "drafter=ar64", "up=up", "down=down"]
    base = [f"models.{k}={tiny_zoo / v}" for k, v in (m.split("=") for m in models)]
    base += ["tau=0", "draft_temperature=0", "draft_rows=8", "draft=serial", "prompt=two crosses"]
    captions, ids = ["two crosses", "a red circle"], torch.arange(2)

    def first_draft(*extra):
        cfg = compose_config("infer", base + list(extra))
        m = Pipeline.from_config(cfg, {"mulosd"})
        assert m.drafter.net.cfg.grid == 8 and m.verifier.cfg_scale != 9.0  # one round holds the whole low-res grid
        return m, m.decode("mulosd", cfg, captions, ids, rounds=True)[1].rounds[0].low_draft.view(2, 8, 8)

    m, guided = first_draft("draft_cfg_scale=9.0")
    greedy = Warpers(temperature=0)
    want = decode_ar(ARBackbone(m.drafter.net, m.drafter.encoder, 9.0), captions, warpers=greedy, image_ids=ids)[0]
    assert torch.equal(guided, want)
    plain = first_draft()[1]
    assert torch.equal(plain, decode_ar(ARBackbone(m.drafter.net, m.drafter.encoder, m.verifier.cfg_scale), captions,
                                        warpers=greedy, image_ids=ids)[0])
    assert not torch.equal(guided, plain)


@pytest.mark.parametrize("drafter", [None, "multi"])
def test_a_multi_resolution_verifier_is_its_own_drafter(tiny_zoo, drafter):
    """One checkpoint, two views: the drafter is the verifier's weights at the low grid, with its own cache."""
    from mulosd.pipeline import Pipeline
    from mulosd.zoo import load_ar

    models = ["tokenizer=tok", "verifier=multi", "up=up", "down=down"] + ([f"drafter={drafter}"] if drafter else [])
    cfg = compose_config("infer", [f"models.{k}={tiny_zoo / v}" for k, v in (m.split("=") for m in models)]
                         + ["tau=0.05", "prompt=two crosses"])
    m = Pipeline.from_config(cfg, {"mulosd"})
    assert m.grid == 16 and m.drafter.net.cfg.grid == 8
    if drafter is None:
        assert m.drafter.net.head.weight is m.verifier.net.head.weight and m.drafter.encoder is m.verifier.encoder
    tokens, trace = m.decode("mulosd", cfg, ["two crosses"], torch.arange(1), rounds=True)
    assert tokens.shape == (1, 16, 16) and trace.rounds
    low, _, meta = load_ar(tiny_zoo / "multi", resolution=64)
    assert low.cfg.grid == 8 and meta["resolution"] == 64
    with pytest.raises(ValueError, match="not at 32 px"):
        load_ar(tiny_zoo / "multi", resolution=32)
    with pytest.raises(ValueError, match="not at 64 px"):
        load_ar(tiny_zoo / "ar128", resolution=64)



def test_size_picks_the_grid_a_multi_resolution_verifier_decodes_at(tiny_zoo):
    """`size=64` decodes the 64 + 128 px model at 64 px (its 32 px drafter: none, so `ar` only); a size it was not
    trained at, or a size for a backbone that fixes its own, is a one-line error."""
    from mulosd.config import ConfigError
    from mulosd.pipeline import Pipeline

    models = [f"models.tokenizer={tiny_zoo / 'tok'}", f"models.verifier={tiny_zoo / 'multi'}", "prompt=two crosses"]
    for size, grid in ((None, 16), (128, 16), (64, 8)):
        cfg = compose_config("infer", models + ([] if size is None else [f"size={size}"]))
        pipe = Pipeline.from_config(cfg, {"ar"})
        assert pipe.grid == grid
        assert pipe.decode("ar", cfg, ["two crosses"], torch.arange(1))[0].shape == (1, grid, grid)
    with pytest.raises(ConfigError, match="not at 256 px"):
        Pipeline.from_config(compose_config("infer", models + ["size=256"]), {"ar"})
    with pytest.raises(ConfigError, match="size"):
        validate_infer(compose_config("infer", ["backbone=tar", "size=256"]))

def test_the_shipped_256_px_verifier_drafts_with_its_128_px_view_and_its_own_samplers(monkeypatch):
    """Zoo v3 at size=256: U_2 / D_2 are the ones trained between its 16 x 16 and 32 x 32 grids (synthscenes256_*),
    not the 128 px ones; r = 4 there drafts with its 64 px view through U_4's GAN stage (the only one shipped: the
    others are named in a one-line error)."""
    import mulosd.zoo as zoo
    from mulosd.config import ConfigError

    loaded, load_sampler = [], zoo.load_sampler
    monkeypatch.setattr(zoo, "load_sampler", lambda name, *a, **k: loaded.append(name) or load_sampler(name, *a, **k))
    base = ["models.verifier=synthscenes_ar_v3", "size=256", "prompt=two crosses"]
    pipe = Pipeline.from_config(compose_config("infer", base), {"mulosd"})
    assert (pipe.grid, pipe.drafter.net.cfg.grid) == (32, 16)
    assert pipe.drafter.net.head.weight is pipe.verifier.net.head.weight  # one copy of the weights
    assert [Path(n).name for n in loaded] == ["synthscenes256_up2_gan", "synthscenes256_down2"]
    loaded.clear()
    Pipeline.from_config(compose_config("infer", base + ["stage=mse_lpips"]), {"mulosd"})
    assert Path(loaded[0]).name == "synthscenes256_up2_mse_lpips"
    loaded.clear()
    pipe = Pipeline.from_config(compose_config("infer", base + ["r=4"]), {"mulosd"})
    assert pipe.drafter.net.cfg.grid == 8
    assert [Path(n).name for n in loaded] == ["synthscenes256_up4_gan", "synthscenes256_down4"]
    with pytest.raises(ConfigError, match="synthscenes256_up4_token_ce"):
        Pipeline.from_config(compose_config("infer", base + ["r=4", "stage=token_ce"]), {"mulosd"})


def test_a_multi_resolution_export_may_record_sampling_defaults_per_size(tiny_zoo, tmp_path):
    import json
    import shutil

    from mulosd.pipeline import Pipeline
    from mulosd.zoo import load_ar

    shutil.copytree(tiny_zoo / "multi", tmp_path / "multi")
    config = json.loads((tmp_path / "multi" / "config.json").read_text())
    config["sample_by_resolution"] = {"64": {"cfg_scale": 7.0, "cfg_schedule": "linear"}}
    (tmp_path / "multi" / "config.json").write_text(json.dumps(config))  # the weights' hash is unchanged
    assert load_ar(tmp_path / "multi", resolution=64)[2]["sample"]["cfg_scale"] == 7.0
    assert load_ar(tmp_path / "multi")[2]["sample"]["cfg_scale"] == config["sample"]["cfg_scale"]
    models = [f"models.tokenizer={tiny_zoo / 'tok'}", f"models.verifier={tmp_path / 'multi'}",
              f"models.up={tiny_zoo / 'up'}", f"models.down={tiny_zoo / 'down'}"]
    pipe = Pipeline.from_config(compose_config("infer", models), {"mulosd"})
    assert pipe.drafter.cfg_scale == 7.0 and pipe.verifier.cfg_scale == config["sample"]["cfg_scale"]
    # guidance schedules the same way: per size where recorded (none at 128 px: an export from before schedules
    # guides at a constant scale), the command line's for every model
    assert pipe.backbone("verifier").cfg_schedule == "constant" and pipe.backbone("drafter").cfg_schedule == "linear"
    config["sample"]["cfg_schedule"] = "linear"
    del config["sample_by_resolution"]["64"]["cfg_schedule"]
    (tmp_path / "multi" / "config.json").write_text(json.dumps(config))
    pipe = Pipeline.from_config(compose_config("infer", models), {"mulosd"})
    assert {pipe.backbone(w).cfg_schedule for w in ("verifier", "drafter")} == {"linear"}
    pipe = Pipeline.from_config(compose_config("infer", [*models, "cfg_schedule=constant"]), {"mulosd"})
    assert {pipe.backbone(w).cfg_schedule for w in ("verifier", "drafter")} == {"constant"}


@pytest.mark.slow
def test_reference_draws_each_prompt_in_the_verifiers_training_world(tiny_zoo, tmp_path):
    """decoding=reference renders as the verifier's world does (its recorded object sizes); an export that
    records no world was trained on the default one."""
    import shutil

    from mulosd.data.synthscenes import parse_caption, realise, render
    from mulosd.data.synthscenes.vocab import RADIUS_RANGE
    from mulosd.zoo import annotate

    shutil.copytree(tiny_zoo / "ar128", tmp_path / "big")
    annotate(tmp_path / "big", world={"radius": [0.14, 0.145]})
    text = "a red circle"
    for verifier, radius in (("ar128", RADIUS_RANGE), ("big", (0.14, 0.145))):
        out = tmp_path / verifier
        model = tmp_path / "big" if verifier == "big" else tiny_zoo / "ar128"
        r = subprocess.run([sys.executable, "infer.py", "decoding=reference", f"prompt={text}",
                            f"models.verifier={model}", f"out_dir={out}", f"hydra.run.dir={out / 'h'}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        want = render(realise(parse_caption(text), np.random.default_rng([0, 0]), radius), 128)
        assert np.array_equal(np.asarray(Image.open(out / "000.png")), want), verifier


@pytest.mark.parametrize("strategy", ["mulosd", "sd"])
def test_asking_a_pipeline_for_a_strategy_it_did_not_load_is_a_one_line_error(tiny_zoo, strategy):
    models = [f"models.tokenizer={tiny_zoo / 'tok'}", f"models.verifier={tiny_zoo / 'ar128'}"]
    cfg = compose_config("infer", models)
    pipe = Pipeline.from_config(cfg, {"ar"})
    with pytest.raises(ValueError, match=f"loaded without the models it drafts with \\({strategy}\\)") as e:
        pipe.decode(strategy, cfg, ["a circle"], torch.arange(1))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown decoding 'beam'"):
        pipe.decode("beam", cfg, ["a circle"], torch.arange(1))


def test_the_synthscenes_pipeline_loads_every_model_on_the_configured_device(tiny_zoo, monkeypatch):
    """device=cuda puts every model there (it once left the SynthScenes zoo on the CPU, silently); checked here
    by the device each loader is asked for, the models themselves loaded on the CPU."""
    import mulosd.tokenizer.neighbours as neighbours
    import mulosd.zoo as zoo

    asked = []
    for name, real in ((n, getattr(zoo, n)) for n in ("load_ar", "load_tokenizer", "load_sampler")):
        def spy(*args, _real=real, _name=name, device="cpu", **kw):
            if sys._getframe(1).f_globals["__name__"] == "mulosd.pipeline":  # not a check's own load
                asked.append((_name, device))
            return _real(*args, **kw)
        monkeypatch.setattr(zoo, name, spy)

    class Table:  # the neighbour table, moved to the device once
        def to(self, device):
            asked.append(("neighbours", device))
            return self
    monkeypatch.setattr(neighbours, "cached_neighbour_table", lambda codebook, k: Table())
    models = [f"models.{k}={tiny_zoo / v}" for k, v in (("tokenizer", "tok"), ("verifier", "ar128"),
                                                         ("drafter", "ar64"), ("small", "small"), ("up", "up"),
                                                         ("down", "down"))]
    Pipeline.from_config(compose_config("infer", [*models, "device=cuda"]), {"ar", "sd", "mulosd"})
    assert {what for what, _ in asked} == {"load_ar", "load_tokenizer", "load_sampler", "neighbours"}
    assert all(device == "cuda" for _, device in asked), asked
