"""The README's claims against behaviour: every command line it shows composes and validates, the error lines
it quotes are what the commands print, and its first training run (shrunk) trains and decodes."""

import re
import shlex
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from mulosd.config.bench import validate_bench
from mulosd.config.infer import validate_infer
from mulosd.config.train import validate_train

from .conftest import ROOT, compose_config

README = (ROOT / "README.md").read_text()
CONFIGS = {"train.py": ("train", validate_train), "infer.py": ("infer", validate_infer),
           "bench.py": ("bench", validate_bench)}


def _commands() -> list[list[str]]:
    """`python X.py ...` lines of the README's bash blocks (continuations joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line.split(" #")[0]) if line.startswith("python ") else []
            if len(words) > 1 and words[1] in CONFIGS:
                out.append(words[1:])
    return out


def _concrete(args: list[str]) -> bool:
    """A line with placeholders (a|b choices, [optional] groups, RUN/DIR paths) shows a pattern, not a command."""
    return not any("|" in a or a.startswith("[") or re.search(r"\bRUN|DIR\b|DATE|\.\.\.", a) for a in args)


COMMANDS = [c for c in _commands() if _concrete(c)]


def test_the_readme_shows_commands_for_every_entry_point():
    assert {c[0] for c in COMMANDS} == set(CONFIGS), COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c)[:80])
def test_every_command_line_in_the_readme_composes_and_validates(command):
    script, *overrides = command
    name, validate = CONFIGS[script]
    overrides = [o for o in overrides if not o.startswith(("hydra.", "-m"))]
    validate(compose_config(name, overrides))


def test_every_prompt_the_readme_shows_is_one_the_world_teaches():
    """A SynthScenes prompt in a README command is a composition the shipped zoo was trained on (a colour in a
    counting or position prompt is not), so that what the README shows can work."""
    from mulosd.data.synthscenes import parse_caption, untaught

    prompts = [a.split("=", 1)[1] for c in _commands() for a in c if a.startswith("prompt=") and
               not any(b.startswith("backbone=") for b in c)]
    assert prompts
    for text in prompts:
        assert untaught(parse_caption(text)) is None, text


@pytest.mark.slow
def test_the_shipped_zoo_draws_every_readme_prompt_at_the_default_seed():
    """Each README command with a SynthScenes prompt, decoded as it says (and with `ar`) at seed 0 by the shipped
    zoo, passes the judge: what the README shows works."""
    import torch

    from mulosd.data.synthscenes import judge, parse_caption
    from mulosd.pipeline import Pipeline

    commands = [[a for a in c[1:] if not a.startswith(("hydra.", "out_dir", "compare"))] for c in _commands()
                if c[0] == "infer.py" and any(a.startswith("prompt=") for a in c)
                and not any(a.startswith(("backbone=", "models.")) for a in c)]
    assert commands
    for overrides in commands:
        cfg = compose_config("infer", overrides)
        pipe = Pipeline.from_config(cfg, {cfg.decoding, "ar"})
        for strategy in {cfg.decoding, "ar"}:
            tokens, _ = pipe.decode(strategy, cfg, [cfg.prompt], torch.arange(1))
            verdict = judge(pipe.images(tokens)[0], parse_caption(cfg.prompt))
            assert verdict.ok, (strategy, overrides, verdict.checks)


def test_the_readmes_knob_table_gives_the_schemas_defaults():
    """Each row of the README's table of decoding knobs: its keys exist and its defaults are the schema's."""
    cfg = compose_config("infer", [])
    table = re.search(r"The decoding knobs that matter most.*?\n\n(\|.*?)\n\n", README, re.S).group(1)
    for row in table.splitlines()[2:]:
        keys_cell, default_cell = row.split("|")[1:3]
        keys = re.findall(r"`([\w.]+)`", keys_cell)
        defaults = [d.strip().strip("`") for d in default_cell.split(",")]
        if keys[0].startswith("models."):
            continue
        for key, default in zip(keys, defaults, strict=True):
            value = "null" if cfg[key] is None else str(cfg[key])  # as one writes it on the command line
            assert value.lower() == default.lower(), (key, cfg[key], default)


def _quoted_errors() -> list[tuple[list[str], str]]:
    block = re.search(r"Mistakes stop.*?```\n(.*?)```", README, re.S).group(1).splitlines()
    return [(shlex.split(cmd[2:])[1:], err) for cmd, err in zip(block[::2], block[1::2], strict=True)]


@pytest.mark.slow
@pytest.mark.parametrize("command, error", _quoted_errors(), ids=lambda x: str(x)[:60])
def test_the_quoted_error_lines_are_what_the_commands_print(command, error, tmp_path):
    r = subprocess.run([sys.executable, *command, f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(error.removesuffix("...").rstrip()), r.stderr


@pytest.mark.slow
def test_the_first_training_run_trains_and_its_export_decodes(tmp_path):
    """The README's quick run, shrunk to 2 batches on a few scenes (the overrides appended win), then the
    README's infer line on its export."""
    block = re.search(r"## A first training run.*?```bash\n(.*?)```", README, re.S).group(1)
    train, infer = (shlex.split(c.split(" #")[0]) for c in block.replace("\\\n", " ").strip().splitlines())
    run = tmp_path / "quick"
    r = subprocess.run([*[sys.executable if w == "python" else w for w in train], "model.train.batches=2",
                        "model.train.val_every=1", "model.train.val_batches=1", f"data.synth.dir={tmp_path / 'shards'}",
                        "data.synth.per_shard=16", f"hydra.run.dir={run}", "logger=none"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 2 batches (32 samples, 0 skipped)" in r.stdout
    assert OmegaConf.load(run / ".hydra" / "config.yaml").model.loss.stage == "token_ce"
    infer = [sys.executable if w == "python" else w.replace("outputs/quick", str(run)) for w in infer]
    r = subprocess.run([*infer, "compare_repeats=1", f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'h'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].startswith("speedup=")


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md", "docs/results.md"])
def test_the_user_documents_tell_no_lab_history(doc):
    """The history (working sessions, training cycles by number, old and new defaults) is docs/log.md's."""
    text = (ROOT / doc).read_text()
    history = re.compile(r"\bsessions?\b|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|"
                         r"eleventh|twelfth) (session|cycle|period)\b|\bcycle \d\b|\bsince (the|20\d\d)\b|"
                         r"\bused to\b|\b(old|new|earlier|previous) default\b|\bLatest:", re.I)
    found = [m.group(0) for m in history.finditer(text)]
    assert not found, found
