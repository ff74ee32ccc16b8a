"""Untrusted text on a terminal (server/cli/text.py): escaped, never interpreted."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from xpufleet.server.cli.text import safe


def test_the_probes_run_name_cannot_paint_the_screen():
    assert safe("\x1b[2J\x1b[31mFAKE succeeded") == "\\x1b[2J\\x1b[31mFAKE succeeded"
    assert safe("a\rb\x07\x08\x7f\x9b") == "a\\x0db\\x07\\x08\\x7f\\x9b"
    assert safe("evil\u202etxt.exe\u2066") == "evil\\u202etxt.exe\\u2066"  # bidi overrides reorder a line
    assert safe("\ud800") == "\\ud800"  # a lone surrogate no terminal encoding can print
    assert safe("one\ntwo\tthree") == "one\\x0atwo\\x09three"
    assert safe("one\ntwo\tthree", lines=True) == "one\ntwo\tthree"
    assert safe("名前 ü ok") == "名前 ü ok" and safe(42) == "42"


@given(st.text())
def test_nothing_a_terminal_interprets_survives(text):
    out = safe(text)
    assert all(ch >= " " and not 0x7f <= ord(ch) <= 0x9f and not 0xD800 <= ord(ch) <= 0xDFFF for ch in out)
    out.encode("utf-8")  # always printable
    kept = safe(text, lines=True)
    assert all(ch in "\n\t" or ch >= " " for ch in kept)


def test_line_and_paragraph_separators_and_every_other_invisible_are_escaped():
    # the probe's repro: U+2028 printed raw started a new line on some terminals
    assert safe("ok\u2028FAKE line") == "ok\\u2028FAKE line"
    assert safe("a\u2029b\x85c") == "a\\u2029b\\x85c"  # paragraph separator, NEL
    assert safe("x\u2028y", lines=True) == "x\\u2028y"  # lines keeps only \n and \t
    # bidi marks and embeddings, zero-width space, word joiner, BOM, soft hyphen, private use, unassigned
    assert safe("\u200e\u200f\u061c\u202a\u2067") == "\\u200e\\u200f\\u061c\\u202a\\u2067"
    assert safe("a\u200bb\u2060c\ufeffd\xade") == "a\\u200bb\\u2060c\\ufeffd\\xade"
    assert safe("\ue000\U000f0000\u0378") == "\\ue000\\U000f0000\\u0378"
    assert safe("\U000e0041") == "\\U000e0041"  # a tag character (Cf)


def test_printable_text_of_every_script_passes_untouched():
    for text in ("café naïve", "名前", "Привет", "مرحبا", "שלום", "🙂 👩\u200d💻", "x\u00a0y", "a\u3000b",
                 "क्\u200dष", "e\u0301", "∑ ≤ ½ ©"):
        assert safe(text) == text, text


@given(st.text())
def test_only_printable_categories_survive(text):
    for ch in safe(text):
        assert unicodedata.category(ch)[0] in "LMNPS" or unicodedata.category(ch) == "Zs" or ch in "\u200c\u200d", \
            repr(ch)
