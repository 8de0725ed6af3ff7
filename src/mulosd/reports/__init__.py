"""Command-line reports on trained models (python -m mulosd.reports.tokenizer | .ar | .samplers): each
evaluates on held-out SynthScenes scenes and prints a table and one summary line. They sit above the model
packages and the zoo, which never import them."""

from pathlib import Path


def publish(text: str, line: str, out: Path | None = None) -> None:
    """A report's ending: its text printed (and written to `out`, when given), then its one summary line last."""
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text if text.endswith("\n") else text + "\n")
    print(line)
