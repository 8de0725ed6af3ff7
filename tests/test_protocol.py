"""The reporting protocol of docs/results.md held by tests: choices are made on the development worlds, the README
reports a world none of them is, and every number of the README's results section is in the evidence it links."""

import re
from pathlib import Path

from mulosd.eval import DEVELOPMENT_WORLDS, EVAL_SEED, REPORT_WORLD
from mulosd.reports.judge_audit import SETS

from .conftest import ROOT

README = (ROOT / "README.md").read_text()
RESULTS = README.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]


def test_the_worlds_choices_look_at_are_development_worlds():
    assert EVAL_SEED in DEVELOPMENT_WORLDS  # the default prompt set of bench.py, infer's reports and the tuner
    assert set(SETS) <= set(DEVELOPMENT_WORLDS)  # the judge's rules were chosen on (some of) the audit's worlds
    assert REPORT_WORLD not in DEVELOPMENT_WORLDS


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
