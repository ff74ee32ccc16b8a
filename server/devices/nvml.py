"""NVIDIA cards through nvidia-ml-py (imported as ``pynvml``): the one NVML wrapper of the package,
used by the agent's inventory and by the predictor's snapshot.

A card is found by its UUID, and a process's ``cuda:N`` is the N-th entry of its
``CUDA_VISIBLE_DEVICES`` exactly as CUDA reads it (:func:`visible_order`): an index, or a ``GPU-``
UUID prefix; CUDA stops at the first entry it cannot resolve.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from ...constants import BYTES_PER_GB

log = logging.getLogger("xpufleet.devices")

GIB = BYTES_PER_GB

RETRY_S = 60.0  # a failed NVML initialisation of the shared instance is retried after this long


@dataclass(frozen=True)
class NvmlCard:
    """One NVML device: its NVML index, UUID, name, total and free bytes (None when NVML fails)."""

    index: int
    uuid: str
    name: str
    total: int | None
    free: int | None


def norm_uuid(uuid: Any) -> str:
    """Compare-ready UUID: lower case, without the ``GPU-`` prefix."""
    s = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    s = s.strip().lower()
    return s[4:] if s.startswith("gpu-") else s


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An initialised NVML (``ok``), or why not (``reason``); figures are read fresh on every call."""

    def __init__(self) -> None:
        self.ok = False
        self.reason = ""
        self._mod: Any = None
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # no driver / no card: a machine without NVIDIA GPUs
            self.reason = f"NVML unavailable ({type(exc).__name__}: {exc})"
            return
        self._mod = pynvml
        self.ok = True

    def cards(self) -> list[NvmlCard]:
        """Every NVML device; [] when NVML cannot list them (logged); None figures when it cannot
        read a card's memory (unknown, never a guess)."""
        if not self.ok:
            return []
        nv = self._mod
        try:
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
            uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        except Exception as exc:
            log.warning("NVML failed to list cards: %s", exc)
            return []
        self._handles = handles
        out = []
        for i, (h, uuid) in enumerate(zip(handles, uuids, strict=True)):
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                total, free = int(mem.total), int(mem.free)
            except Exception:
                total = free = None
            try:
                name = _text(nv.nvmlDeviceGetName(h))
            except Exception:
                name = "NVIDIA GPU"
            out.append(NvmlCard(i, uuid, name, total, free))
        return out


    def process_memory(self, names: dict[str, int], pids_by_run: dict[str, set[int]]) -> dict[str, dict[str, float]]:
        """GiB each run's processes use per card (NVML's per-process figures, compute and graphics
        contexts). ``names``: card name -> NVML index (of the last :meth:`cards`); runs without any use
        are left out."""
        if not self.ok or not pids_by_run:
            return {}
        run_of = {pid: run for run, pids in pids_by_run.items() for pid in pids}
        out: dict[str, dict[str, float]] = {}
        for name, index in names.items():
            for pid, mem in self.card_processes(index).items():
                run = run_of.get(pid)
                if run is not None:
                    per = out.setdefault(run, {})
                    per[name] = round(per.get(name, 0.0) + mem / GIB, 3)
        return out

    def card_processes(self, index: int) -> dict[int, int]:
        """Every process NVML lists on card ``index`` (of the last :meth:`cards`), pid -> bytes it uses
        (compute and graphics contexts); a process whose figure NVML does not give is left out."""
        handles = getattr(self, "_handles", [])
        if not self.ok or index >= len(handles):
            return {}
        used: dict[int, int] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(self._mod, getter)(handles[index])
            except Exception:  # noqa: BLE001 - not supported on this card or driver
                continue
            for p in procs:
                mem = getattr(p, "usedGpuMemory", None)
                if isinstance(mem, int) and mem >= 0:  # None / NVML_VALUE_NOT_AVAILABLE: unknown
                    used[p.pid] = max(used.get(p.pid, 0), mem)
        return used


_SHARED_LOCK = threading.Lock()
_SHARED: dict[str, Any] = {"nvml": None, "tried": float("-inf")}


def shared() -> Nvml:
    """This process's NVML for repeated short reads (the predictor's snapshots): initialised once;
    after a failure, tried again at most every ``RETRY_S`` seconds."""
    with _SHARED_LOCK:
        nvml = _SHARED["nvml"]
        if nvml is not None and (nvml.ok or time.monotonic() - _SHARED["tried"] < RETRY_S):
            return nvml
        _SHARED["tried"] = time.monotonic()
        _SHARED["nvml"] = nvml = Nvml()
        return nvml


def reset_shared() -> None:
    """Forget the shared NVML (tests that swap the ``pynvml`` module)."""
    with _SHARED_LOCK:
        _SHARED["nvml"], _SHARED["tried"] = None, float("-inf")


def visible_order(cards: list[NvmlCard], visible: str | None) -> list[NvmlCard]:
    """The cards in the order a CUDA process sees them under ``CUDA_VISIBLE_DEVICES=visible``
    (``None``: all, in NVML order). Entries are indices or ``GPU-`` UUID prefixes; like CUDA, the list
    stops at the first entry that resolves to no card (an index out of range, a MIG or unknown entry)."""
    if visible is None:
        return list(cards)
    out: list[NvmlCard] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            break
        if entry.isdigit():
            i = int(entry)
            if i >= len(cards):
                break
            out.append(cards[i])
            continue
        if not entry.lower().startswith("gpu-"):
            break
        key = norm_uuid(entry)
        match = next((c for c in cards if norm_uuid(c.uuid).startswith(key)), None)
        if match is None:
            break
        out.append(match)
    return out
