"""Device names: the one parser every part uses (agent, scheduler, API validation, nodes, predictor).

Canonical names are torch's, with two decisions made once here: ``mps`` is ``mps:0`` (there is one
MPS device) and ``cpu`` takes no index (``cpu:0`` is refused with what to write, so a device set can
never list the CPU twice under two names). A bare kind (``cuda``) means "any card of that kind" and
``auto`` "the run's first device"; each is accepted only where the caller says so.
"""

from __future__ import annotations

import re
from typing import Any

from ...constants import ACCELERATOR_KINDS, DEVICE_KINDS

_DEVICE_RE = re.compile(rf"^({'|'.join(DEVICE_KINDS)})(?::(\d+))?$")


class DeviceSpecError(ValueError):
    """A device name, ``--devices`` or ``--simulate`` value that cannot be used (the text says what to fix)."""


def normalize_device(name: Any, *, allow_kind: bool = False, allow_auto: bool = False) -> str:
    """Canonical device name (``cuda:0``, ``cpu``, ``mps:0``; a bare kind such as ``cuda`` with
    ``allow_kind``; ``auto`` with ``allow_auto``). Raises DeviceSpecError saying what is accepted."""
    if not isinstance(name, str):
        raise DeviceSpecError(f"a device name must be a string like 'cuda:0', got {name!r}")
    text = name.strip().lower()
    if allow_auto and text == "auto":
        return "auto"
    m = _DEVICE_RE.match(text)
    if not m:
        accepted = "cpu, cuda:N, xpu:N, mps" + (", cuda, xpu" if allow_kind else "") + (", auto" if allow_auto else "")
        raise DeviceSpecError(f"invalid device {name!r}: use {accepted}")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        if index is not None:
            raise DeviceSpecError(f"invalid device {name!r}: cpu takes no index, write 'cpu'")
        return "cpu"
    if kind == "mps":
        if index not in (None, "0"):
            raise DeviceSpecError(f"invalid device {name!r}: there is one MPS device, write 'mps'")
        return "mps:0"
    if index is None:
        if not allow_kind:
            raise DeviceSpecError(f"invalid device {name!r}: name one card, e.g. '{kind}:0'")
        return kind
    return f"{kind}:{int(index)}"


def device_kind(name: str) -> str:
    """``cuda:1`` -> ``cuda``; ``cpu`` -> ``cpu``."""
    return name.split(":", 1)[0]


def device_index(name: str) -> int | None:
    """``cuda:1`` -> 1; a name without an index (``cpu``, ``cuda``) -> None."""
    return int(name.split(":", 1)[1]) if ":" in name else None


def is_accelerator(name: str) -> bool:
    """True for a CUDA, XPU or MPS device (or kind)."""
    return device_kind(name) in ACCELERATOR_KINDS


def parse_device_list(text: str | None) -> list[str] | None:
    """``--devices cuda:0,cuda:1`` -> ``["cuda:0", "cuda:1"]``; None/empty -> None (offer all)."""
    if text is None or not str(text).strip():
        return None
    out: list[str] = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        name = normalize_device(part)
        if name not in out:
            out.append(name)
    return out or None
