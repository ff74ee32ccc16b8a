"""What the slot rule knows about providers and their devices (docs/sidecar.md): pure records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..devices.names import device_kind


def short_id(run_id: str) -> str:
    return run_id[:8]


# --- providers ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceOffer:
    """One device a provider offers, by the provider's own name for it."""

    name: str
    kind: str = ""
    uuid: str | None = None
    total_gib: float | None = None

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", device_kind(self.name))


@dataclass(frozen=True)
class ProviderInfo:
    """What the slot rule and target resolution know about a provider.

    ``online``: connected now (the sidecar is always online). ``draining``: takes no new runs.
    Workers that connected once since the server started stay known while offline (their runs wait).
    ``mounts``: the storage mount labels it declares (docs/workers.md). ``disabled``: an SSH worker the user
    disabled (listed, never chosen for a new run). ``note``: why it takes no new run when that is not
    draining (``has taken its one run`` for a one-shot instance, ``is disabled``). ``comfyui``: the state
    of its ComfyUI (``none``, ``probing``, ``ready``, ``failed``: server/comfyflow/reading.py) and
    ``comfyui_reading`` what it offers (opaque here: the check routing.py is given reads it).
    """

    name: str
    devices: tuple[DeviceOffer, ...]
    online: bool = True
    draining: bool = False
    is_local: bool = False
    mounts: frozenset[str] = frozenset()
    disabled: bool = False
    note: str = ""
    cannot_run: str = ""  # this server without the packages that run graphs: why (the 400's text)
    comfyui: str = "none"
    comfyui_reading: Any = field(default=None, compare=False)

    @property
    def label(self) -> str:
        return "this server" if self.is_local else f"worker {self.name}"

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def where(self, device: str) -> str:
        """``cuda:0 on this server`` / ``cuda:1 on gpu-box``."""
        return f"{device} on this server" if self.is_local else f"{device} on {self.name}"


