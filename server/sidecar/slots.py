"""The slot book (docs/sidecar.md): the providers the dispatcher knows and who holds which of their slots.

One owner for the provider table, the holdings (runs, unit instances, a spread run's other parts) and the
slot state built from them: the state is rebuilt when providers change and kept current in between as
holders take and release slots. The queue, the memory part, the spread runs and restart recovery all
read and change slots through it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..scheduling import LimitOverrides, ProviderInfo, SlotState, build_state
from .providers import provider_info

log = logging.getLogger("xpufleet.dispatcher")

Holding = tuple[str, tuple[str, ...]]  # (provider, devices)


class SlotBook:
    """Providers by name, slot holdings by holder id, and the slot state planned against."""

    def __init__(self, overrides: LimitOverrides | None = None) -> None:
        self.overrides = overrides or LimitOverrides()
        self.providers: dict[str, Any] = {}
        self.holdings: dict[str, Holding] = {}  # holder id -> (provider, devices): assigned/running runs too
        self._state: SlotState | None = None  # None: rebuilt at the next read
        self._last_warnings: list[str] = []

    def infos(self) -> list[ProviderInfo]:
        """The slot rule's view of every provider."""
        return [provider_info(p) for p in self.providers.values()]

    def invalidate(self) -> None:
        """Providers changed: the state is built again at the next :meth:`state`."""
        self._state = None

    def state(self) -> SlotState:
        """The slot state (built from the providers when they changed, else the one kept current)."""
        if self._state is None:
            self._state = build_state(self.infos(), self.overrides, self.holdings)
            if self._state.warnings != self._last_warnings:
                for w in self._state.warnings:
                    log.warning("slot limits: %s", w)
                self._last_warnings = list(self._state.warnings)
        return self._state

    def hold(self, holder_id: str, provider: str, devices: Sequence[str]) -> None:
        """Count ``holder_id`` on the slots of ``devices``."""
        self.holdings[holder_id] = (provider, tuple(devices))
        if self._state is not None:
            self._state.hold(holder_id, provider, tuple(devices))

    def release(self, holder_id: str) -> bool:
        """Free the holder's slots; False when it held none."""
        if self.holdings.pop(holder_id, None) is None:
            return False
        if self._state is not None:
            self._state.release(holder_id)
        return True
