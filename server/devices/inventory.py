"""What one agent (or the sidecar) offers (docs/workers.md, docs/architecture.md): the CPU always, then real or simulated
cards, filtered by ``--devices``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from .info import DeviceInfo, to_bytes
from .nvml import Nvml
from .probe import cpu_device, cuda_cards, mps_devices, xpu_devices
from .simulated import SimulatedCard, simulated_file, write_simulated_file

log = logging.getLogger("xpufleet.devices")


class Inventory:
    """What one agent offers: CPU always, then real or simulated cards, filtered by ``--devices``."""

    def __init__(
        self,
        worker: str,
        home: Path,
        devices: list[str] | None = None,
        simulate: list[SimulatedCard] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.worker = worker
        self.only = devices
        self.simulate = list(simulate or [])
        self.env = dict(os.environ if env is None else env)
        self.sim_path = simulated_file(home, worker) if self.simulate else None
        self._sim_last: dict[str, dict[str, Any]] = {}
        self._nvml: Nvml | None = None
        self._nvml_index: dict[str, int] = {}  # cuda:N of this agent -> NVML index (last probe)
        self._other_present: bool | None = None
        self.notes: list[str] = []
        if self.simulate:
            cards = {
                c.name: {"label": f"Simulated GPU ({c.total_gib:g} GiB)", "total_gib": c.total_gib,
                         "free_gib": c.total_gib, "uuid": c.uuid}
                for c in self.simulate
            }
            self._sim_last = cards
            write_simulated_file(self.sim_path, cards)

    @property
    def simulated(self) -> bool:
        """True when this agent's cards are simulated (W6)."""
        return bool(self.simulate)

    def _simulated_devices(self) -> list[DeviceInfo]:
        try:
            data = json.loads(self.sim_path.read_text())
            cards = data["cards"]
            for c in self.simulate:  # keep name/total/uuid from the command line; take free from file
                free = float(cards[c.name]["free_gib"])
                if not 0 <= free <= c.total_gib:
                    raise ValueError(f"{c.name} free_gib {free} outside 0..{c.total_gib}")
                self._sim_last[c.name]["free_gib"] = free
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("simulated cards file %s unreadable (%s); keeping the last figures", self.sim_path, exc)
        return [
            DeviceInfo(c.name, label=self._sim_last[c.name]["label"], uuid=c.uuid,
                       total_bytes=to_bytes(c.total_gib), free_bytes=to_bytes(self._sim_last[c.name]["free_gib"]),
                       simulated=True)
            for c in self.simulate
        ]

    def _real_accelerators(self) -> list[DeviceInfo]:
        if self._nvml is None:
            self._nvml = Nvml()
            if not self._nvml.ok:
                self.notes.append(f"CUDA: {self._nvml.reason}")
        cards = cuda_cards(self._nvml, self.env)
        self._nvml_index = {info.name: card.index for info, card in cards}
        out = [info for info, _ in cards]
        if self._other_present is None or self._other_present:
            try:
                other = xpu_devices() + mps_devices()
            except Exception as exc:  # a broken torch build must not stop the agent
                if self._other_present is None:
                    self.notes.append(f"xpu/mps probe failed: {exc}")
                other = []
            if self._other_present is None:
                self._other_present = bool(other)  # probe torch again only where it found cards
            out += other
        return out

    def devices(self) -> list[DeviceInfo]:
        """Devices offered now, with total/free memory and UUIDs; CPU first."""
        accel = self._simulated_devices() if self.simulate else self._real_accelerators()
        if self.only is not None:
            accel = [d for d in accel if d.name in self.only]
            # --devices order is the order the worker lists its cards in
            accel.sort(key=lambda d: self.only.index(d.name))
        return [cpu_device(), *accel]

    def snapshot(self) -> list[dict[str, Any]]:
        """:meth:`devices` in their wire form (hello, heartbeat; GiB)."""
        return [d.to_wire() for d in self.devices()]

    def process_memory(self, pids_by_run: dict[str, set[int]]) -> dict[str, dict[str, float]]:
        """GiB each run's processes use per card, from NVML (real NVIDIA cards only: simulated cards have
        no such figure, and none is made up)."""
        if self.simulate or self._nvml is None:
            return {}
        out = self._nvml.process_memory(self._nvml_index, pids_by_run)
        if self.only is not None:
            out = {r: {d: v for d, v in per.items() if d in self.only} for r, per in out.items()}
        return {r: per for r, per in out.items() if per}

    def check_requested(self) -> list[str]:
        """Names in ``--devices`` that this machine does not have (empty when all exist)."""
        if self.only is None:
            return []
        have = {d["name"] for d in self.snapshot()}
        return [d for d in self.only if d != "cpu" and d not in have]


def environment_summary(inventory: Inventory) -> dict[str, Any]:
    """A short description of the agent's environment for the Workers panel."""
    import platform

    summary: dict[str, Any] = {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "simulated": inventory.simulated,
    }
    try:  # the torch version without importing torch (import costs seconds)
        from importlib.metadata import version

        summary["torch"] = version("torch")
    except Exception:
        summary["torch"] = None
    if inventory.notes:
        summary["notes"] = list(inventory.notes)
    return summary
