"""How graph data enters a script ``xpufleet export`` writes: only as Python literals (docs/export.md).

A graph can come from anyone, and running its exported script must never run code the graph's author
chose. So no text from the graph (node ids, class names, titles, widget values, the file name) is
ever pasted into the script as code or as raw comment text: values go through :func:`py_literal`,
comments and the module docstring quote them with ``repr`` / :func:`docstring_literal`, and variable
names are made by the exporter, not taken from ids (:func:`variable_bases`). Node ids the script
would print (progress lines, metrics) must be printable: :func:`check_node_ids` refuses the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from .validation import cut

LITERAL_MAX_DEPTH = 20  # widget values are scalars; the exporter's own lists nest two levels


class UnsafeNameError(ValueError):
    """A node id (or name) an exported script cannot show; the text says which and what to change."""


def first_unprintable(text: str) -> str | None:
    """The first character of ``text`` that is not printable (control characters, line and paragraph
    separators such as U+2028/U+2029/U+0085, bidirectional overrides, lone surrogates), else None."""
    return next((ch for ch in text if not ch.isprintable()), None)


def check_node_ids(ids: Iterable[Any]) -> None:
    """Raise :class:`UnsafeNameError` for the first node id holding a character that cannot be shown
    safely: the script prints ids in its progress and metrics lines, where a newline or an escape
    sequence would forge output."""
    for nid in ids:
        bad = first_unprintable(str(nid))
        if bad is not None:
            raise UnsafeNameError(
                f"node id {cut(ascii(str(nid)))} holds U+{ord(bad):04X}, a control, line-separator or "
                f"formatting character that an exported script cannot show safely; rename the node "
                f"(give it an id of printable characters, such as a number) and export again")


def py_literal(value: Any, depth: int = 0) -> str:
    """``value`` (str, int, float, bool, None, or lists/tuples/dicts of them) as Python source that
    evaluates to an equal value and holds no name, call or comment the value could choose; a
    non-finite float becomes ``float('inf')``. Anything else raises ValueError."""
    if depth > LITERAL_MAX_DEPTH:
        raise ValueError(f"a value nests more than {LITERAL_MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)  # repr of these types is always a literal that round-trips
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({repr(value)!r})"
    if isinstance(value, (list, tuple)):
        items = ", ".join(py_literal(v, depth + 1) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k, depth + 1)}: {py_literal(v, depth + 1)}"
                               for k, v in value.items()) + "}"
    raise ValueError(f"a {type(value).__name__} value cannot be written into a script")


_DOC_ESCAPES = {"\\": "\\\\", '"': '\\"'}


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted string literal whose value is exactly ``text``: backslashes and
    double quotes are escaped (no quote can close it), and so is every unprintable character but the
    newline (``\\u2028``, ``\\r``, ``\\x1b``), so the source shows every line as Python reads it."""
    out = []
    for ch in text:
        if ch in _DOC_ESCAPES:
            out.append(_DOC_ESCAPES[ch])
        elif ch == "\n" or ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return '"""' + "".join(out) + '"""'


_PLAIN_ID = re.compile(r"[0-9A-Za-z]+", re.ASCII)


def variable_bases(ids: Iterable[str]) -> dict[str, str]:
    """A variable-name stem for each node id: ``n8`` for an id of ASCII letters and digits (no
    underscore, so ``n8_model`` cannot be read two ways), ``x0``, ``x1``, ... for every other id.
    The stems are distinct, so two ids never share a variable (``1-a`` and ``1_a`` once did)."""
    bases: dict[str, str] = {}
    others = 0
    for nid in ids:
        if _PLAIN_ID.fullmatch(nid):
            bases[nid] = f"n{nid}"
        else:
            bases[nid] = f"x{others}"
            others += 1
    return bases
