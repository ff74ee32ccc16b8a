"""What the registry's parts need of the dispatcher (docs/architecture.md): one Protocol, so the workers package
depends on an interface, not on ``sidecar/dispatcher.py``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class RunsPort(Protocol):
    """The dispatcher as the worker parts call it: run events back, provider changes, the slot view."""

    home: Path
    memory: Any  # MemoryAdmission (server/memory/admission.py): shared cards' reports and views
    overrides: Any
    providers: Mapping[str, Any]

    def run_ended(self, run_id: str, status: str, error: str | None = None) -> Any: ...

    def run_process_started(self, run_id: str, pid: int | None) -> Any: ...

    def ingest(self, run_id: str, events: list[dict[str, Any]]) -> Any: ...

    def providers_changed(self) -> None: ...

    def register_provider(self, provider: Any) -> None: ...

    def unregister_provider(self, name: str) -> None: ...

    def provider_infos(self) -> Any: ...


class SshPort(Protocol):
    """The SSH workers (server/ssh/manager.py) as the registry's parts ask about them."""

    def has(self, name: str) -> bool: ...

    def is_disabled(self, name: str) -> bool: ...

    def describe(self, name: str) -> dict[str, Any]: ...

    async def forget(self, name: str) -> dict[str, Any]: ...
