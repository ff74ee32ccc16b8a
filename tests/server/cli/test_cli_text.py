"""Untrusted text on a terminal (server/cli/text.py): escaped, never interpreted."""

from __future__ import annotations

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
