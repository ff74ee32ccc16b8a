"""Probing this machine's real devices: NVIDIA cards through nvidia-ml-py (nvml.py, with UUIDs), Intel
GPUs through stock ``torch.xpu``, Apple ``mps``, and the CPU through psutil (host.py for commit charge).

Heavy modules (pynvml, torch) are imported lazily, only where a device of their kind may exist.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from .host import host_memory
from .info import DeviceInfo
from .nvml import Nvml, NvmlCard, visible_order

log = logging.getLogger("xpufleet.devices")


def cpu_device() -> DeviceInfo:
    """The CPU entry every agent offers: RAM total and available, and the host's commit charge (the
    predictor's P_load needs it for worker cards)."""
    import platform

    import psutil

    vm = psutil.virtual_memory()
    label = platform.processor() or platform.machine() or "CPU"
    host = host_memory()
    return DeviceInfo("cpu", label=f"{label} ({os.cpu_count() or 1} cores)", total_bytes=int(vm.total),
                      free_bytes=int(vm.available), commit_used_bytes=host.commit_used,
                      commit_limit_bytes=host.commit_limit)


def cuda_cards(nvml: Nvml, parent_env: dict[str, str]) -> list[tuple[DeviceInfo, NvmlCard]]:
    """NVIDIA cards as this process's ``cuda:N`` (its own CUDA_VISIBLE_DEVICES applied), by UUID,
    each with its NVML card."""
    order = visible_order(nvml.cards(), parent_env.get("CUDA_VISIBLE_DEVICES"))
    return [(DeviceInfo(f"cuda:{n}", label=c.name, uuid=c.uuid, total_bytes=c.total, free_bytes=c.free), c)
            for n, c in enumerate(order)]


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


def xpu_devices() -> list[DeviceInfo]:
    """Intel GPUs through stock ``torch.xpu`` (torch is imported only when a DRM device of Intel's is there)."""
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
        out.append(DeviceInfo(f"xpu:{i}", label=str(getattr(props, "name", "Intel GPU")),
                              uuid=str(dev_uuid) if dev_uuid else None,
                              total_bytes=None if total is None else int(total),
                              free_bytes=None if free is None else int(free)))
    return out


def mps_devices() -> list[DeviceInfo]:
    """Apple's MPS device (one), with the recommended maximum as its total and no free figure."""
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
    # MPS has no free figure (docs/workers.md: shared MPS cards report no total either for budgets).
    return [DeviceInfo("mps:0", label="Apple MPS", total_bytes=None if total is None else int(total))]
