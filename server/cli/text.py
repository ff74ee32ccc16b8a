"""Untrusted text on a terminal: the one helper every ``xpufleet`` command prints run and worker data
through (names, errors, log lines, reasons), so a run named ``"\\x1b[2J..."`` cannot clear the screen,
paint text or reorder a line.

Escaped: C0 and C1 control characters (ESC, BEL, CR, backspace, ...), DEL, the Unicode bidirectional
overrides and isolates (which reorder what a line shows), and lone surrogates (which no terminal
encoding can print). Each becomes its Python escape (``\\x1b``, ``\\u202e``), so nothing is lost.
"""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(value: Any, lines: bool = False) -> str:
    """``str(value)`` with every control character escaped. ``lines`` keeps newlines and tabs (a
    multi-line error); otherwise they are escaped too (a table cell, a name)."""
    text = value if isinstance(value, str) else str(value)
    return (_UNSAFE if lines else _UNSAFE_ONE_LINE).sub(_escape, text)
