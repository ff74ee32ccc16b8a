"""``DeviceInfo``: one device as every part sees it (the agent's inventory, the sidecar's own devices,
the heartbeat, the Workers data).

Inside the process figures are bytes; on the wire (hello, heartbeat, ``GET /api/workers``) they are
GiB with the ``_gib`` suffix docs/sidecar.md names (``total_gib``, ``free_gib``). The predictor's snapshot
fields are docs/predictor.md's ``*_gb`` names (docs/predictor.md), also GiB: ``predictor.snapshot.snapshot_from_card``
is the one place a wire card becomes a snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...constants import BYTES_PER_GB
from .names import device_index, device_kind, normalize_device

GIB = BYTES_PER_GB  # one definition of a GiB: constants.py


def to_gib(n_bytes: float | int | None) -> float | None:
    """Bytes -> GiB rounded to 3 places (the wire form); None stays None (unknown, never a guess)."""
    return None if n_bytes is None else round(float(n_bytes) / GIB, 3)


def to_bytes(gib: Any) -> int | None:
    if isinstance(gib, bool) or not isinstance(gib, int | float):
        return None
    return int(round(float(gib) * GIB))


@dataclass(frozen=True)
class DeviceInfo:
    """A device: its machine name (``cpu``, ``cuda:0``, ``xpu:1``, ``mps:0``), kind and index, UUID
    (cards that have one), a label, total and free bytes (None when unknown), and whether it is a
    simulated card (docs/architecture.md). The CPU entry also carries the host's commit charge (docs/predictor.md's S_virt)."""

    name: str
    label: str = ""
    uuid: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    simulated: bool = False
    commit_used_bytes: int | None = None
    commit_limit_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", normalize_device(self.name))

    @property
    def kind(self) -> str:
        return device_kind(self.name)

    @property
    def index(self) -> int | None:
        return device_index(self.name)

    def to_wire(self) -> dict[str, Any]:
        """The form agents send and the API shows."""
        out: dict[str, Any] = {
            "name": self.name, "kind": self.kind, "label": self.label, "uuid": self.uuid,
            "total_gib": to_gib(self.total_bytes), "free_gib": to_gib(self.free_bytes), "simulated": self.simulated,
        }
        if self.kind == "cpu":
            out["commit_used_gib"] = to_gib(self.commit_used_bytes)
            out["commit_limit_gib"] = to_gib(self.commit_limit_bytes)
        return out

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> DeviceInfo:
        """A device from its wire form (``mps`` is ``mps:0``); ValueError for a bad name."""
        return cls(
            name=str(d["name"]), label=str(d.get("label") or ""), uuid=d.get("uuid") or None,
            total_bytes=to_bytes(d.get("total_gib")), free_bytes=to_bytes(d.get("free_gib")),
            simulated=bool(d.get("simulated")), commit_used_bytes=to_bytes(d.get("commit_used_gib")),
            commit_limit_bytes=to_bytes(d.get("commit_limit_gib")),
        )
