"""LlamaGen's caption preprocessing before FLAN-T5, reproduced: the text cleaning its T5 features were trained
with (DeepFloyd IF's), applied twice, as upstream applies it both when extracting training features and when
sampling. A caption the model never saw in this form gets other T5 features, hence other images.

The cleaning, in order: URL-unquote and lower-case; drop URLs, HTML tags, @handles, CJK blocks; one dash for
every kind of dash and one quote style; drop HTML entities, IP addresses, trailing article ids, literal "\\n",
#ids, long numbers and file names; collapse repeated quotes and dots, stray punctuation and " . "; split
word-joined-by-dashes-or_underscores captions; fix the text's encoding (ftfy) and unescape HTML twice; drop
product codes, shipping / download / click-for phrases, image-format words, "page N", sizes like 10x20; tidy
spaces after punctuation and around colons; strip wrapping quotes and leading or trailing punctuation.
"""

from __future__ import annotations

import html
import re
import urllib.parse

_URL = r"\b((?:{}:(?:\/{{1,3}}|[a-zA-Z0-9%])|[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)))"
_DASHES = ("\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0\ufe31"
           "\ufe32\ufe58\ufe63\uff0d")
_BAD_PUNCT = "#®•©™&@·º½¾¿¡§~)(\\][}{|\\\\/*"
_FILE_TYPES = "png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4"

# (pattern, replacement), in upstream's order; the HTML and encoding steps run between them
_BEFORE_HTML = [(r"<person>", "person"), (_URL.format("https?"), ""), (_URL.format("www"), "")]
_BEFORE_FIX = [
    (r"@[\w\d]+\b", ""),  # @handles
    *((f"[{a}-{b}]+", "") for a, b in (("\u31c0", "\u31ef"), ("\u31f0", "\u31ff"), ("\u3200", "\u32ff"),
                                       ("\u3300", "\u33ff"), ("\u3400", "\u4dbf"), ("\u4dc0", "\u4dff"),
                                       ("\u4e00", "\u9fff"))),  # CJK strokes, katakana extensions, ideographs...
    (f"[{_DASHES}]+", "-"),
    ("[`´«»“”¨]", '"'), ("[‘’]", "'"),
    (r"&quot;?", ""), (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),  # article ids
    (r"\\n", " "),
    (r"#\d{1,3}\b", ""), (r"#\d{5,}\b", ""), (r"\b\d{6,}\b", ""),
    (rf"[\S]+\.(?:{_FILE_TYPES})", ""),  # file names
    (r"[\"\']{2,}", '"'), (r"[\.]{2,}", " "),
    (f"[{_BAD_PUNCT}]{{1,}}", " "), (r"\s+\.\s+", " "),
]
_AFTER_FIX = [
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""), (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""), (r"\b\d+[a-zA-Z]+\d+\b", ""),  # codes
    (r"(worldwide\s+)?(free\s+)?shipping", ""), (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (rf"\b(?:{_FILE_TYPES})(\simage[s]?)?", ""), (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),  # sizes, with a Latin, Cyrillic or multiplication x
    (r"\b\s+\:\s+", ": "), (r"(\D[,\./])\b", r"\1 "), (r"\s+", " "),
]
_AFTER_STRIP = [(r"^[\"\']([\w\W]+)[\"\']$", r"\1"), (r"^[\'\_,\-\:;]", ""), (r"[\'\_,\-\:\-\+]$", ""),
                (r"^\.\S+$", "")]


def _apply(rules, text: str) -> str:
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


def clean_caption(caption: str) -> str:
    """One pass of upstream's cleaning (see the module docstring)."""
    import ftfy
    from bs4 import BeautifulSoup

    text = urllib.parse.unquote_plus(str(caption)).strip().lower()
    text = _apply(_BEFORE_HTML, text)
    text = BeautifulSoup(text, features="html.parser").text
    text = _apply(_BEFORE_FIX, text)
    joiners = re.compile(r"(?:\-|\_)")
    if len(joiners.findall(text)) > 3:  # this-is-my-cute-cat
        text = joiners.sub(" ", text)
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    text = _apply(_AFTER_FIX, text)
    return _apply(_AFTER_STRIP, text).strip()


def preprocess(caption: str) -> str:
    """What LlamaGen feeds its T5 tokenizer: the cleaning, twice."""
    return clean_caption(clean_caption(caption))
