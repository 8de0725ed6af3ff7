"""Captions: `Prompt` → English and back.

The grammar is small and closed (GenEval's prompt shapes plus the background), so the parser is exact:
`parse_caption(caption_text(p)) == p` for every prompt, and a word outside the vocabulary is refused with
the offending words and the vocabulary named, rather than silently ignored.

    caption    := [ "a photo of" ] objects [ "on" "a" [bg-texture] [bg-colour] "background" ]
    objects    := phrase [ ( "and" | relation ) phrase ]
    phrase     := ( "a" | "an" | count-word ) [texture] [colour] shape-or-plural
"""

from __future__ import annotations

import re

from . import vocab
from .scene import ObjectSpec, Prompt


class CaptionError(ValueError):
    """A caption outside the SynthScenes grammar."""


_PLURAL_TO_SHAPE = {p: s for s, p in vocab.SHAPE_PLURALS.items()}
_WORD_TO_COUNT = {"a": 1, "an": 1, **{w: n for n, w in vocab.COUNT_WORDS.items()}}
_RELATION_WORDS = {tuple(v.split()): k for k, v in vocab.RELATION_PHRASES.items()}
_RELATION_WORDS.update({tuple(k.split()): k for k in vocab.RELATIONS})  # GenEval also says "left of"
_COLOUR_ALIASES = {"grey": "gray"}

VOCABULARY = sorted(
    set(_WORD_TO_COUNT) | set(vocab.SHAPES) | set(_PLURAL_TO_SHAPE) | set(vocab.COLOURS)
    | set(vocab.BACKGROUND_COLOURS) | set(_COLOUR_ALIASES) | set(vocab.OBJECT_TEXTURES)
    | set(vocab.BACKGROUND_TEXTURES) | {w for words in _RELATION_WORDS for w in words}
    | {"and", "on", "background", "photo", "of"}
)


def _phrase(spec: ObjectSpec) -> str:
    words = []
    if spec.texture != "solid":
        words.append(spec.texture)
    if spec.colour:
        words.append(spec.colour)
    if spec.count == 1:
        words.append(spec.shape)
        det = "an" if words[0][0] in "aeiou" else "a"
    else:
        words.append(vocab.SHAPE_PLURALS[spec.shape])
        det = vocab.COUNT_WORDS[spec.count]
    return " ".join([det, *words])


def caption_text(prompt: Prompt) -> str:
    """The canonical caption of a prompt, e.g. 'a red circle above a blue square on a striped green background'."""
    parts = [_phrase(prompt.objects[0])]
    if len(prompt.objects) == 2:
        parts.append(vocab.RELATION_PHRASES[prompt.relation] if prompt.relation else "and")
        parts.append(_phrase(prompt.objects[1]))
    if prompt.background or prompt.background_texture:
        bg = [w for w in (prompt.background_texture, prompt.background) if w]
        parts.append("on a " + " ".join(bg) + " background")
    return " ".join(parts)


def _tokens(text: str) -> list[str]:
    text = re.sub(r"[.,!;:]", " ", text.lower())
    words = text.split()
    if words[:3] == ["a", "photo", "of"]:
        words = words[3:]
    return [_COLOUR_ALIASES.get(w, w) for w in words]


def parse_caption(text: str) -> Prompt:
    """Parse a caption into its structured requirements; raises CaptionError naming what is wrong."""
    words = _tokens(text)
    if not words:
        raise CaptionError("empty caption")
    unknown = sorted({w for w in words if w not in VOCABULARY})
    if unknown:
        raise CaptionError(f"unknown word(s) {', '.join(repr(w) for w in unknown)} in caption {text!r}; "
                           f"the SynthScenes vocabulary is: {' '.join(VOCABULARY)}")
    background = background_texture = None
    if words[-1] == "background":
        if "on" not in words:
            raise CaptionError(f"expected 'on a ... background' in {text!r}")
        at = len(words) - 1 - words[::-1].index("on")
        bg_words, words = words[at + 1:-1], words[:at]
        if bg_words[:1] == ["a"]:
            bg_words = bg_words[1:]
        for w in bg_words:
            if w in vocab.BACKGROUND_TEXTURES and background_texture is None:
                background_texture = w
            elif w in vocab.BACKGROUND_COLOURS and background is None:
                background = w
            else:
                raise CaptionError(f"cannot read background {' '.join(bg_words)!r} in {text!r}: expected "
                                   f"[{'|'.join(vocab.BACKGROUND_TEXTURES)}] [{'|'.join(vocab.BACKGROUND_COLOURS)}]")
    objects, relation, pos = [], None, 0
    while True:
        spec, pos = _parse_phrase(words, pos, text)
        objects.append(spec)
        if pos == len(words):
            break
        if objects and len(objects) == 2:
            raise CaptionError(f"a caption names at most two kinds of object: {text!r}")
        if words[pos] == "and":
            pos += 1
            continue
        for rel_words, rel in _RELATION_WORDS.items():
            if tuple(words[pos:pos + len(rel_words)]) == rel_words:
                relation, pos = rel, pos + len(rel_words)
                break
        else:
            raise CaptionError(f"expected 'and' or a relation ({', '.join(vocab.RELATION_PHRASES.values())}) "
                               f"at {' '.join(words[pos:])!r} in {text!r}")
    try:
        return Prompt(objects=tuple(objects), background=background, background_texture=background_texture,
                      relation=relation)
    except ValueError as e:
        raise CaptionError(f"{e}: {text!r}") from None


def _parse_phrase(words: list[str], pos: int, text: str) -> tuple[ObjectSpec, int]:
    if pos >= len(words) or words[pos] not in _WORD_TO_COUNT:
        got = words[pos] if pos < len(words) else "the end"
        raise CaptionError(f"expected a/an or a number before an object, got {got!r} in {text!r}")
    count, pos = _WORD_TO_COUNT[words[pos]], pos + 1
    texture, colour = "solid", None
    if pos < len(words) and words[pos] in vocab.OBJECT_TEXTURES:
        texture, pos = words[pos], pos + 1
    if pos < len(words) and words[pos] in vocab.COLOURS:
        colour, pos = words[pos], pos + 1
    if pos >= len(words) or (words[pos] not in vocab.SHAPES and words[pos] not in _PLURAL_TO_SHAPE):
        got = words[pos] if pos < len(words) else "the end"
        raise CaptionError(f"expected a shape ({', '.join(vocab.SHAPES)}), got {got!r} in {text!r}")
    shape = _PLURAL_TO_SHAPE.get(words[pos], words[pos])
    return ObjectSpec(shape=shape, colour=colour, texture=texture, count=count), pos + 1
