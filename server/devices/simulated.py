"""Simulated CUDA cards (docs/architecture.md): scheduled, renumbered and budgeted like real ones; the work runs on
the CPU. A card has a name, a total, a deterministic UUID and a free figure a test can change while the
agent runs: they live in ``$XPUFLEET_HOME/agents/<name>-simulated.json``, which the agent writes at
start and re-reads at every heartbeat. Every simulated figure says ``"simulated": true``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common import atomic
from ...constants import SIMULATED_UUID_PREFIX
from .names import DeviceSpecError, normalize_device

_SIM_RE = re.compile(r"^cuda:(\d+)=(\d+(?:\.\d+)?)(?:@([A-Za-z0-9][A-Za-z0-9-]{0,63}))?$")


@dataclass(frozen=True)
class SimulatedCard:
    """One simulated CUDA card of ``--simulate``."""

    name: str  # machine name, cuda:N
    total_gib: float
    uuid: str


def simulated_uuid(worker: str, device: str) -> str:
    """A deterministic UUID for a simulated card: same worker + device -> same UUID, across runs."""
    tail = uuid.uuid5(uuid.NAMESPACE_URL, f"xpufleet-simulated/{worker}/{device}").hex
    return f"{SIMULATED_UUID_PREFIX}-{tail[:4]}-{tail[4:8]}-{tail[8:12]}-{tail[12:24]}"


def parse_simulate(text: str | None, worker: str) -> list[SimulatedCard]:
    """``"cuda:0=24,cuda:1=24@GPU-shared-1"`` -> simulated cards (GiB; ``@UUID`` optional).

    Two agents that name the same ``@UUID`` simulate one physical card offered twice (docs/sidecar.md).
    """
    if text is None or not str(text).strip():
        return []
    cards: list[SimulatedCard] = []
    seen: set[str] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = _SIM_RE.match(part)
        if not m:
            raise DeviceSpecError(
                f"invalid --simulate entry {part!r}: write cuda:N=GIB or cuda:N=GIB@UUID, e.g. cuda:0=24"
            )
        name = f"cuda:{int(m.group(1))}"
        total = float(m.group(2))
        if total <= 0:
            raise DeviceSpecError(f"invalid --simulate entry {part!r}: the card needs more than 0 GiB")
        if name in seen:
            raise DeviceSpecError(f"--simulate lists {name} twice")
        seen.add(name)
        cards.append(SimulatedCard(name, total, m.group(3) or simulated_uuid(worker, name)))
    return cards


def simulated_file(home: Path, worker: str) -> Path:
    """Where an agent's simulated cards (and the free figures a test may change) live."""
    return Path(home) / "agents" / f"{worker}-simulated.json"


def write_simulated_file(path: Path, cards: dict[str, dict[str, Any]]) -> None:
    """Atomically write ``{"cards": {name: {...}}}`` (a reader never sees half a file)."""
    atomic.write_json(path, {"simulated": True, "cards": cards})


def set_simulated_free(home: Path, worker: str, device: str, free_gib: float) -> None:
    """Change a simulated card's free figure while its agent runs (tests, demos)."""
    path = simulated_file(home, worker)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeviceSpecError(f"no simulated cards for worker {worker!r} ({path}): {exc}") from None
    cards = data.get("cards") or {}
    device = normalize_device(device)
    if device not in cards:
        raise DeviceSpecError(f"worker {worker!r} simulates {', '.join(cards) or 'no cards'}, not {device}")
    total = float(cards[device]["total_gib"])
    if not 0 <= float(free_gib) <= total:
        raise DeviceSpecError(f"free_gib must be between 0 and the card's {total} GiB")
    cards[device]["free_gib"] = float(free_gib)
    write_simulated_file(path, cards)
