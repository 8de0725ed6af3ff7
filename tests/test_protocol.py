"""The reporting protocol of docs/results.md held by tests: choices are made on the development worlds, the README
reports a world none of them is, and every number of the README's results section is in the evidence it links."""

import re
from pathlib import Path

import pytest

from mulosd.eval import DEVELOPMENT_WORLDS, EVAL_SEED, REPORT_WORLD
from mulosd.reports.judge_audit import SETS

from .conftest import ROOT

README = (ROOT / "README.md").read_text()
RESULTS = README.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]


def test_the_worlds_choices_look_at_are_development_worlds():
    """The prompt sets that choose something (bench.py's and the reports' default, the sampling tuner's, the zoo
    cycle's, the judge audit's) are development worlds; the report world is none of them."""
    from mulosd.config.bench import BenchConfig

    assert BenchConfig().prompt_seed in DEVELOPMENT_WORLDS and EVAL_SEED in DEVELOPMENT_WORLDS
    assert set(SETS) <= set(DEVELOPMENT_WORLDS)  # the judge's rules were chosen on (some of) the audit's worlds
    script = (ROOT / "scripts" / "zoo_cycle.sh").read_text()
    seeds = re.findall(r"--prompt-seed (\d+)", script) + re.findall(r"for seed in ([\d ]+);", script)[0].split()
    assert seeds and {int(s) for s in seeds} <= set(DEVELOPMENT_WORLDS), seeds
    assert REPORT_WORLD not in DEVELOPMENT_WORLDS


@pytest.mark.parametrize("seed", [REPORT_WORLD, EVAL_SEED, 0])
def test_the_sampling_tuner_refuses_the_report_world_and_the_ar_report_set(seed, capsys):
    from mulosd.reports.ar_tune import main

    with pytest.raises(SystemExit) as stop:
        main(["--model", "synthscenes_ar_v2", "--prompt-seed", str(seed)])
    assert stop.value.code == 2 and "tune on another world seed" in capsys.readouterr().err


def test_the_readme_reports_the_report_world_and_nothing_under_conf_or_scripts_uses_it():
    seeds = set(re.findall(r"prompt_seed=(\d+)", RESULTS))
    assert seeds == {str(REPORT_WORLD)}, seeds
    for folder in ("conf", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file():
                assert not re.search(rf"\b{REPORT_WORLD}\b", path.read_text(errors="ignore")), path


def _evidence() -> str:
    """The text of every repository file the results section links (a folder: its README.md and tables)."""
    texts = []
    for target in re.findall(r"\]\(([^)#]+)", RESULTS):
        path = ROOT / target
        assert path.exists(), target
        files = [path] if path.is_file() else [*path.glob("*.md"), *path.glob("*.csv")]
        texts += [f.read_text() for f in files if f.suffix in (".md", ".csv")]
    return "\n".join(texts)


def test_every_number_in_the_readme_results_is_in_the_evidence_it_links():
    """Each decimal of the section (a speed-up, a GenEval, an interval, a time per step) appears, written the same
    way, in a file the section links: a number edited by hand, or left from an older run, fails."""
    evidence = _evidence()
    prose = re.sub(r"```.*?```", "", RESULTS, flags=re.S)  # commands are checked by test_readme
    numbers = set(re.findall(r"(?<![\w.])[+-]?\d+\.\d+", prose))
    assert len(numbers) > 10, numbers  # the section reports a table
    missing = sorted(n for n in numbers if n.lstrip("+") not in evidence and n not in evidence)
    assert not missing, f"README numbers not in the linked evidence: {missing}"


def test_the_evidence_linked_names_the_report_world():
    assert re.search(rf"\bworld {REPORT_WORLD}\b", _evidence(), re.I)


def test_results_md_names_the_protocol_and_the_report_world():
    text = Path(ROOT / "docs" / "results.md").read_text()
    assert "## Protocol" in text and str(REPORT_WORLD) in text.split("## Protocol", 1)[1].split("\n## ", 1)[0]
