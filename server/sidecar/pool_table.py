"""What the dispatcher reads of one-shot worker pools (docs/workers.md): each pool's live instances, the
pools that take no new run, and why a pool run waits. The worker registry fills it; the dispatcher gets it
at construction (``Dispatcher(..., pools=...)``) and never writes it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

PoolReason = Callable[[str, str], "str | None"]


class PoolsView(Protocol):
    """The pools as the dispatcher sees them."""

    def live(self) -> Mapping[str, list[str]]:
        """Pool name -> the names of its live instances."""

    def closed(self) -> Mapping[str, str]:
        """Pool name -> why it takes no new submission (its credential was revoked)."""

    def waiting_reason(self, pool: str, run_id: str) -> str | None:
        """Why a queued run of ``pool`` waits (None: the plan's own text says it better)."""


def comfyui_pools(view: Any) -> Collection[str]:
    """The pools whose instances run ComfyUI workflows (their spec names a ComfyUI folder); a view without
    the notion has none."""
    comfyui = getattr(view, "comfyui", None)
    return comfyui() if comfyui is not None else ()


class PoolTable:
    """A :class:`PoolsView` that the pools' owner fills with :meth:`update` (empty: no pools)."""

    def __init__(self, reason: PoolReason | None = None) -> None:
        self._live: dict[str, list[str]] = {}
        self._closed: dict[str, str] = {}
        self._reason = reason

    def update(self, live: Mapping[str, list[str]], closed: Mapping[str, str],
               reason: PoolReason | None = None) -> None:
        """The pools now (``reason``: why a pool run waits, when the owner has one)."""
        self._live = dict(live)
        self._closed = dict(closed)
        if reason is not None:
            self._reason = reason

    def live(self) -> Mapping[str, list[str]]:
        return self._live

    def closed(self) -> Mapping[str, str]:
        return self._closed

    def waiting_reason(self, pool: str, run_id: str) -> str | None:
        return self._reason(pool, run_id) if self._reason is not None else None
