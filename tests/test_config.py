import dataclasses
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mulosd import training
from mulosd.config import ConfigError
from mulosd.config.infer import validate_infer
from mulosd.config.train import (
    MODEL_SCHEMAS,
    ARModelConfig,
    DataConfig,
    LoggerConfig,
    SamplerLossConfig,
    SamplerModelConfig,
    TokenizerModelConfig,
    validate_train,
)
from mulosd.training import available_experiments, build_logger, build_trainer

from .conftest import ROOT, cli_error, compose_config

GROUPS = {g: sorted(p.stem for p in (ROOT / "conf" / g).glob("*.yaml")) for g in ("data", "trainer", "logger")}
LAION = "data.train_urls='/tmp/none/{00000..00003}.tar'"  # braces need quotes in Hydra overrides


@pytest.mark.parametrize("group, option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_group_option_composes_and_validates(group, option):
    overrides = [f"{group}={option}"] + ([LAION] if option == "laion_coco_aesthetic" else [])
    cfg = compose_config("train", overrides)
    validate_train(cfg)
    assert OmegaConf.select(cfg, group) is not None


@pytest.mark.parametrize("experiment", available_experiments())
def test_every_experiment_composes(experiment):
    validate_train(compose_config("train", [f"experiment={experiment}"]))


def _disagreements(yaml: dict, schema, prefix: str = "") -> list[str]:
    out = []
    for key, value in yaml.items():
        default = getattr(schema, key)
        if isinstance(value, dict) and default is None:  # an optional group (data.synth): its class's defaults
            hint = typing.get_type_hints(type(schema))[key]
            default = next(a for a in typing.get_args(hint) if dataclasses.is_dataclass(a))()
        if isinstance(value, dict) and dataclasses.is_dataclass(default):
            out += _disagreements(value, default, f"{prefix}{key}.")
        elif not (isinstance(value, str) and value.startswith("${")) and value != default:  # ${...}: a top-level knob
            out.append(f"{prefix}{key}: yaml {value!r}, schema {default!r}")
    return out


# (YAML file, key) -> why its value is not the schema's default
DIFFERENT_ON_PURPOSE = {
    ("data/synthscenes.yaml", "name"): "the group option's name; the schema leaves it required",
}


@pytest.mark.parametrize("path, schema", [
    ("model/tokenizer.yaml", TokenizerModelConfig), ("model/ar.yaml", ARModelConfig),
    ("model/sampler.yaml", SamplerModelConfig), ("loss/token_ce.yaml", SamplerLossConfig),
    ("data/synthscenes.yaml", DataConfig), ("logger/wandb.yaml", LoggerConfig),
])
def test_each_schema_default_is_its_default_yaml_value(path, schema):
    """Defaults live once: the YAML a group starts from repeats the schema's defaults or says why not."""
    yaml = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / path))
    found = [d for d in _disagreements(yaml, schema()) if (path, d.split(":")[0]) not in DIFFERENT_ON_PURPOSE]
    assert not found, found


@pytest.mark.parametrize("name", sorted(MODEL_SCHEMAS))
def test_every_model_knob_can_be_set_on_the_command_line(name):
    """Hydra refuses an override of a key its composed config lacks, so each schema field must reach the config
    (model.init_from was once in the schema only: a cycle's `model.init_from=` was refused)."""
    model = compose_config("train", [f"model={name}"] + (["loss=token_ce"] if name == "sampler" else [])).model
    assert not [f.name for f in dataclasses.fields(MODEL_SCHEMAS[name]) if f.name not in model]


def test_infer_config_composes():
    validate_infer(compose_config("infer"))


@pytest.mark.parametrize("override, key", [("seed=-1", "seed"), ("compare_repeats=0", "compare_repeats"),
                                           # the strategies' own checks (decoding/knobs.py), named by infer key
                                           ("lantern_k=-1", "lantern_k"), ("lantern_delta=2", "lantern_delta"),
                                           ("window=0", "window"), ("resample=magic", "resample"),
                                           ("gamma=0", "gamma"), ("draft=later", "draft"),
                                           ("relative=true", "relative")])
def test_infer_out_of_range_values_are_named(override, key):
    with pytest.raises(ConfigError) as e:
        validate_infer(compose_config("infer", [override]))
    assert e.value.key == key


@pytest.mark.parametrize("override, key", [
    ("trainer.no_such_key=1", "no_such_key"),
    ("data.batchsize=4", "batchsize"),
    ("trainer.max_steps=abc", "trainer.max_steps"),
    ("data.synth.per_shard=many", "data.synth.per_shard"),
])
def test_typos_and_wrong_types_fail_at_composition_naming_the_key(override, key):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        compose_config("train", [override])
    text = str(e.value) + str(getattr(e.value, "__cause__", ""))
    assert key in text


@pytest.mark.parametrize("override, key", [
    ("++trainer.max_step=10", "trainer.max_step"),
    ("data.ratios=[3]", "data.ratios"),
    ("data.image_size=100", "data.image_size"),
    ("data.batch_size=0", "data.batch_size"),
    ("task=train", "task"),
    ("logger.name=tensorboard", "logger.name"),
    ("data.batches_per_epoch=-1", "data.batches_per_epoch"),
    ("experiment=zoo_tokenizer model.loss.gan=wgan", "model.loss.gan"),
    ("experiment=zoo_tokenizer model.train.crop=30", "model.train.crop"),
    ("experiment=zoo_tokenizer model.vq.ch_mult=[1,2]", "model.vq.ch_mult (downsample factor 2**(len-1))"),
    ("experiment=zoo_tokenizer ++model.vq.chh=3", "model.vq.chh"),
    ("experiment=zoo_tokenizer model.optim.lr=abc", "model.optim.lr"),
    ("seed=-1", "seed"),  # seeding would take it modulo 2**32
    ("data.synth.seed=-3", "data.synth.seed"),
    ("experiment=zoo_ar_64 model.train.seed=-1", "model.train.seed"),
])
def test_out_of_range_values_are_named(override, key):
    cfg = compose_config("train", override.split())
    with pytest.raises(ConfigError) as e:
        validate_train(cfg)
    assert e.value.key == key


def test_laion_without_shards_is_refused():
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException, ConfigError)) as e:
        validate_train(compose_config("train", ["data=laion_coco_aesthetic"]))
    assert "train_urls" in str(e.value)


def test_yaml_typo_fails_at_composition(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    path = conf / "data" / "synthscenes.yaml"
    path.write_text(path.read_text().replace("batch_size:", "batchsize:"))
    with initialize_config_dir(str(conf), version_base="1.3"):
        with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
            compose(config_name="train")
    assert "batchsize" in str(e.value) + str(e.value.__cause__)


def test_trainer_and_loggers_build_from_config(tmp_path):
    cfg = compose_config("train", [f"logger.save_dir={tmp_path}"])
    trainer = build_trainer(cfg, default_root_dir=tmp_path)
    assert trainer.max_steps == -1 and type(trainer.accelerator).__name__ == "CPUAccelerator"
    for name in ("csv", "none"):
        cfg = compose_config("train", [f"logger={name}", f"logger.save_dir={tmp_path}"] if name == "csv"
                             else [f"logger={name}"])
        logger = build_logger(cfg, tmp_path / "run")
        assert (logger is False) == (name == "none")
    cfg = compose_config("train", [f"logger.save_dir={tmp_path}", "logger.mode=disabled"])
    assert type(build_logger(cfg, tmp_path / "run")).__name__ == "WandbLogger"


@pytest.mark.parametrize("native", [True, False])
def test_cpu_bf16_autocast_only_where_the_cpu_multiplies_bf16(tmp_path, monkeypatch, caplog, native):
    monkeypatch.setattr(training, "cpu_runs_bf16", lambda: native)
    cfg = compose_config("train", ["trainer.precision=bf16-mixed", "logger=none"])
    with caplog.at_level("WARNING", logger="mulosd.training"):
        trainer = build_trainer(cfg, default_root_dir=tmp_path)
    assert type(trainer.precision_plugin).__name__ == ("MixedPrecision" if native else "Precision")
    assert ("no native bfloat16" in caplog.text) != native


@pytest.mark.parametrize("name", ["csv", "wandb"])
def test_logs_go_to_the_run_directory_unless_told(tmp_path, name, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a relative default would have written
    logger = build_logger(compose_config("train", [f"logger={name}", "logger.mode=disabled"]), tmp_path / "run")
    assert Path(logger.save_dir).resolve() == (tmp_path / "run" / "logs").resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_typo_exits_nonzero_naming_the_key():
    r = _run("train.py", "trainer.no_such_key=1")
    assert r.returncode != 0 and "no_such_key" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 10


@pytest.mark.parametrize("script, override, key", [
    ("train.py", "++data.num_worker=3", "data.num_worker"),
    ("train.py", "data.ratios=[8]", "data.ratios"),
    ("infer.py", "prompt=a red dog", "dog"),
    ("infer.py", "decoding=magic", "decoding"),
    ("infer.py", "size=12", "size"),
    ("train.py", "experiment=zoo_tokenizer model.optim.decay_batches=99999", "model.optim.decay_batches"),
    ("train.py", "experiment=upsampler_gan r=3", "r"),
    ("train.py", "experiment=downsampler loss=gan", "model.loss.stage"),
    ("train.py", "experiment=zoo_ar_64 model.cond_dropout=1.5", "model.cond_dropout"),
    ("infer.py", "tau=1.2", "tau"),
    ("infer.py", "resample_window=0", "resample_window"),
    ("train.py", "model.train.batches=-1", "no model is chosen"),  # no experiment: nothing to set it on
])
def test_cli_bad_values_are_one_line_errors(script, override, key, tmp_path, capsys):
    """In-process, the checks the entry points make in their order (test_cli_typo_exits_nonzero_naming_the_key
    and the README's quoted errors run the real interpreters)."""
    args = override.split() if override.startswith("experiment=") else [override]
    assert cli_error(script, args, tmp_path, capsys) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0]


@pytest.mark.slow
def test_fit_without_a_model_names_the_experiments(tmp_path):
    r = _run("train.py", f"hydra.run.dir={tmp_path}")
    assert r.returncode == 2 and "inspect_data" in r.stderr


def test_knob_dataclasses_are_built_from_a_config_by_their_fields():
    from mulosd.decoding import MuLoSDConfig, SDConfig, from_config

    cfg = compose_config("infer", ["tau=0.3", "radius=2", "lantern_k=5", "lantern_delta=0.1", "gamma=3"])
    ml = from_config(MuLoSDConfig, cfg)
    assert (ml.tau, ml.radius, ml.acceptance, ml.resample) == (0.3, 2, cfg.acceptance, cfg.resample)
    sd = from_config(SDConfig, cfg, acceptance="lantern")  # pool_k and delta read lantern_k, lantern_delta
    assert (sd.gamma, sd.pool_k, sd.delta, sd.acceptance) == (3, 5, 0.1, "lantern")
    assert from_config(SDConfig, cfg).acceptance == "exact"  # infer's `acceptance` is MuLo-SD's, never SD's
    with pytest.raises(ConfigError) as e:
        from_config(SDConfig, compose_config("infer", ["lantern_k=-2"]))
    assert e.value.key == "lantern_k"


def test_a_resumed_runs_progress_bar_counts_on_from_its_checkpoint():
    """Lightning resumes mid-epoch without on_train_epoch_start: the bar still shows the epoch, the schedule's
    length and the batches the checkpoint had trained."""
    from types import SimpleNamespace

    from mulosd.training import _BatchProgressBar

    bar = _BatchProgressBar(batches=100)
    bar.on_train_start(SimpleNamespace(current_epoch=0), SimpleNamespace(batches_seen=40))
    b = bar.train_progress_bar
    assert (b.total, b.n, b.initial, b.desc.rstrip(": ")) == (100, 40, 40, "Epoch 0")
    b.close()


def test_the_reference_is_written_from_the_current_schemas():
    """docs/reference.md is generated (python -m mulosd.config.reference): stale means a key, default or help
    text changed without it."""
    from mulosd.config.reference import OUT, render

    assert OUT.read_text() == render(), "docs/reference.md is stale: python -m mulosd.config.reference"
    for key in ("`tau`", "`sjd_window`", "`lantern_k`", "`windows`", "`model.transformer.dim`", "`threads`",
                "`data.synth.train_shards`"):  # an optional group's keys too
        assert key in render(), key


@pytest.mark.parametrize("size", ["128", "256"])
def test_every_downstream_stage_composes_and_validates(size, tmp_path):
    """scripts/zoo_v2_downstream.sh --dry-run prints each stage's train.py command; every one composes and passes
    the training checks (a misspelt override of the 256 px schedules would otherwise surface hours into a run),
    and at 256 px each stage reads the 256 px shards at 256 px and U_r's first stage starts from the shipped one."""
    r = subprocess.run(["bash", "scripts/zoo_v2_downstream.sh", "--dry-run"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "SIZE": size, "RUNS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    commands = [line.split(" train.py ", 1)[1].split() for line in r.stdout.splitlines() if " train.py " in line]
    assert len(commands) == (10 if size == "128" else 8)
    for overrides in commands:
        cfg = compose_config("train", overrides)
        validate_train(cfg)
        assert cfg.data.synth.size == cfg.data.image_size == int(size)
        assert cfg.data.synth.dir.endswith(f"synthscenes{size}_big")
    first = compose_config("train", commands[0])
    assert first.model.init_from == (None if size == "128" else "synthscenes_up2_token_ce")


def test_downstream_refuses_a_size_it_has_no_shards_for(tmp_path):
    r = subprocess.run(["bash", "scripts/zoo_v2_downstream.sh", "--dry-run"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "SIZE": "64", "RUNS": str(tmp_path)})
    assert r.returncode == 2 and "SIZE=64" in r.stderr and not any(tmp_path.iterdir())
