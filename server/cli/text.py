"""Untrusted text on a terminal: the one helper every ``xpufleet`` command prints run and worker data
through (names, errors, log lines, reasons), so a run named ``"\\x1b[2J..."`` cannot clear the screen,
paint text, reorder a line or start a new one.

An allow-list: letters, marks, numbers, punctuation, symbols and spaces (Unicode categories L*, M*, N*,
P*, S*, Zs) pass, and the zero-width joiners ZWNJ/ZWJ that some scripts and emoji need. Everything else
is escaped: C0 and C1 controls (ESC, BEL, CR, NEL U+0085, ...), DEL, the line and paragraph separators
(U+2028, U+2029), format characters (the bidirectional overrides, isolates and marks that reorder what a
line shows, zero-width spaces, ...), private-use and unassigned code points, and lone surrogates (which
no terminal encoding can print). Each becomes its Python escape (``\\x1b``, ``\\u2028``), so nothing is
lost.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Any

_JOINERS = frozenset("\u200c\u200d")


@lru_cache(maxsize=4096)
def _printable(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category[0] in "LMNPS" or category == "Zs" or ch in _JOINERS


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe(value: Any, lines: bool = False) -> str:
    """``str(value)`` with every character outside the printable categories escaped. ``lines`` keeps
    newlines and tabs (a multi-line error); otherwise they are escaped too (a table cell, a name)."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable():  # the common case: nothing to look up
        return text
    keep = "\n\t" if lines else ""
    return "".join(ch if ch in keep or _printable(ch) else _escape(ch) for ch in text)
