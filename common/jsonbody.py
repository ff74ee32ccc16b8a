"""A request body from bytes to a JSON value that every later step can store, encode and walk.

Pure (no I/O), linear in the body, never recursive:

* nesting deeper than ``MAX_JSON_DEPTH`` is refused *before* parsing (Python's parser and every
  recursive step after it, ``json.dumps``, ``copy.deepcopy``, would otherwise hit RecursionError);
* a string (value or key) holding a lone UTF-16 surrogate (``"\\ud800"``: valid JSON, but no UTF-8
  text can hold it, so SQLite and every file write would fail) is refused naming the field;
* integers longer than Python accepts (4,300 digits) and the non-JSON ``NaN``/``Infinity`` literals
  Python's parser would take are refused too.

:func:`decode_body` raises :class:`~.errors.ApiError` (400) with what to fix.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..constants import MAX_JSON_DEPTH
from .errors import ApiError

# A JSON string literal (escapes included): removed before brackets are counted.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# The escape of a UTF-16 surrogate; only then can the parsed value hold a lone one.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def nests_deeper_than(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the arrays/objects of the JSON text ``body`` nest more than ``limit`` levels deep
    (brackets inside strings do not count). Linear, no recursion, no parsing."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # cannot nest deeper than it opens
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if len(brackets) <= limit:
        return False
    import numpy as np  # a running sum over millions of brackets, in C

    a = np.frombuffer(brackets, dtype=np.uint8)
    steps = ((a == ord("[")) | (a == ord("{"))).view(np.int8) * np.int8(2) - np.int8(1)  # +1 opens, -1 closes
    return int(np.cumsum(steps, dtype=np.int32).max()) > limit


def _path_text(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the body"


def lone_surrogate_field(value: Any) -> str | None:
    """The field (``options.name``, ``graph.1.inputs``) of the first string or key holding a lone
    surrogate, or None. Iterative; linear in the value."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return _path_text(path)
        elif isinstance(item, dict):
            for k, v in item.items():
                if _SURROGATE.search(k):
                    shown = k.encode("utf-8", "backslashreplace").decode("ascii", "replace")[:60]
                    return f"a key of {_path_text(path)} ({shown!r})"
                stack.append((v, [*path, _SURROGATE.sub("?", k)]))
        elif isinstance(item, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(item))
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or Infinity); send a number")


def decode_body(body: bytes) -> Any:
    """Parse a request body (see the module docstring); ApiError 400 naming what to fix."""
    if nests_deeper_than(body, MAX_JSON_DEPTH):
        raise ApiError(400, f"the body nests arrays/objects more than {MAX_JSON_DEPTH} levels deep "
                            f"(the limit); flatten it")
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (ValueError, RecursionError) as exc:  # an integer of more digits than Python converts
        raise ApiError(400, f"the body is not usable JSON: {str(exc).split(';')[0]}") from None
    if _SURROGATE_ESCAPE.search(body):
        where = lone_surrogate_field(value)
        if where is not None:
            raise ApiError(400, f"{where}: holds a lone UTF-16 surrogate (an escape like \\ud800 without its "
                                f"pair), which is not Unicode text; send valid UTF-8 text")
    return value
