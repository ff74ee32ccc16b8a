"""Probing this machine's real devices: NVIDIA cards through nvidia-ml-py (``pynvml``, with UUIDs),
Intel GPUs through stock ``torch.xpu``, Apple ``mps``, and the CPU through psutil.

Heavy modules (pynvml, torch) are imported lazily, only where a device of their kind may exist.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from ...constants import BYTES_PER_GB
from .renumbering import parent_list

log = logging.getLogger("xpufleet.devices")

GIB = BYTES_PER_GB  # one definition of a GiB: constants.py


def _gib(n_bytes: float | int | None) -> float | None:
    return None if n_bytes is None else round(float(n_bytes) / GIB, 3)


def cpu_device() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    import platform

    label = platform.processor() or platform.machine() or "CPU"
    from ...predictor.snapshot import host_memory

    host = host_memory()  # commit charge too: the predictor's P_load needs it for worker cards
    return {
        "name": "cpu",
        "kind": "cpu",
        "label": f"{label} ({os.cpu_count() or 1} cores)",
        "uuid": None,
        "total_gib": _gib(vm.total),
        "free_gib": _gib(vm.available),
        "commit_used_gib": round(host["commit_used_gb"], 3),
        "commit_limit_gib": round(host["commit_limit_gb"], 3),
        "simulated": False,
    }


class Nvml:
    """NVIDIA cards through nvidia-ml-py; initialised once, ``None`` figures when NVML fails."""

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
            self.reason = f"NVML unavailable: {exc}"
            return
        self._mod = pynvml
        self.ok = True

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def devices(self, parent_env: dict[str, str]) -> list[dict[str, Any]]:
        if not self.ok:
            return []
        nv = self._mod
        try:
            count = nv.nvmlDeviceGetCount()
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [self._text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        except Exception as exc:
            log.warning("NVML failed to list cards: %s", exc)
            return []
        order = list(range(count))
        visible = parent_list(parent_env.get("CUDA_VISIBLE_DEVICES"))
        if visible is not None:  # the agent's cuda:N is the N-th visible card, as in CUDA
            order = []
            for entry in visible:
                if entry.isdigit() and int(entry) < count:
                    order.append(int(entry))
                elif entry.startswith("GPU-") and any(u.startswith(entry) for u in uuids):
                    order.append(next(i for i, u in enumerate(uuids) if u.startswith(entry)))
                else:
                    break  # CUDA stops at the first entry it cannot resolve
        self._visible = [(f"cuda:{n}", handles[i]) for n, i in enumerate(order)]
        out = []
        for n, i in enumerate(order):
            h = handles[i]
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                total, free = mem.total, mem.free
            except Exception:
                total = free = None
            try:
                label = self._text(nv.nvmlDeviceGetName(h))
            except Exception:
                label = "NVIDIA GPU"
            out.append({
                "name": f"cuda:{n}",
                "kind": "cuda",
                "label": label,
                "uuid": uuids[i],
                "total_gib": _gib(total),
                "free_gib": _gib(free),
                "simulated": False,
            })
        return out


    def process_memory(self, pids_by_run: dict[str, set[int]]) -> dict[str, dict[str, float]]:
        """GiB each run's processes use per card (NVML's per-process figures, compute and graphics
        contexts), by the agent's card names of the last :meth:`devices` call; runs without any are left out."""
        if not self.ok or not pids_by_run:
            return {}
        nv = self._mod
        run_of = {pid: run for run, pids in pids_by_run.items() for pid in pids}
        out: dict[str, dict[str, float]] = {}
        for name, handle in getattr(self, "_visible", []):
            used: dict[int, int] = {}
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    procs = getattr(nv, getter)(handle)
                except Exception:  # noqa: BLE001 - not supported on this card or driver
                    continue
                for p in procs:
                    mem = getattr(p, "usedGpuMemory", None)
                    if isinstance(mem, int) and mem >= 0:  # None / NVML_VALUE_NOT_AVAILABLE: unknown
                        used[p.pid] = max(used.get(p.pid, 0), mem)
            for pid, mem in used.items():
                run = run_of.get(pid)
                if run is not None:
                    per = out.setdefault(run, {})
                    per[name] = round(per.get(name, 0.0) + mem / GIB, 3)
        return out


def _intel_gpu_present() -> bool:
    """A cheap look for an Intel GPU before paying for ``import torch`` (Linux: DRM vendor 0x8086)."""
    if sys.platform.startswith("win"):
        return True
    drm = Path("/sys/class/drm")
    if not drm.is_dir():
        return False
    for vendor in drm.glob("renderD*/device/vendor"):
        try:
            if vendor.read_text().strip().lower() == "0x8086":
                return True
        except OSError:
            continue
    return False


def xpu_devices() -> list[dict[str, Any]]:
    if not _intel_gpu_present():
        return []
    try:
        import torch
    except ImportError:
        return []
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    out = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        total = getattr(props, "total_memory", None)
        free = None
        try:
            free, total = xpu.mem_get_info(i)
        except Exception:  # older torch: no free figure
            pass
        dev_uuid = getattr(props, "uuid", None)
        out.append({
            "name": f"xpu:{i}",
            "kind": "xpu",
            "label": getattr(props, "name", "Intel GPU"),
            "uuid": str(dev_uuid) if dev_uuid else None,
            "total_gib": _gib(total),
            "free_gib": _gib(free),
            "simulated": False,
        })
    return out


def mps_devices() -> list[dict[str, Any]]:
    if sys.platform != "darwin":
        return []
    try:
        import torch
    except ImportError:
        return []
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return []
    total = None
    try:
        total = torch.mps.recommended_max_memory()
    except Exception:
        pass
    # MPS has no free figure (seed 000: shared MPS cards report no total either for budgets).
    return [{"name": "mps:0", "kind": "mps", "label": "Apple MPS", "uuid": None,
             "total_gib": _gib(total), "free_gib": None, "simulated": False}]
